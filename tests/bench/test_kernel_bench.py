#!/usr/bin/python3
"""Smoke test of build/bench/kernel_bench (so the benchmark does not rot).

A short run (int4, 64 MiB pool, a fraction of a second per table, 1 and 3
tokens per linear) must exit 0 and write a JSON in which every kernel table
this CPU runs (scalar first) gave the scalar bits, ran at least one pass
and a positive rate, both RAM probes measured something, and the paired
read before every pass (default on; --paired-read off leaves it out) gave
a rate (no faster than 100x the probe) and a ratio; over one pass that
ratio is exactly the kernel's rate over the read's. --isa and
--rounds time only the named tables once per round, with a probe between
rounds, and summarize each table by the median and range of its rounds;
--huge on|off (default on) is recorded in the JSON. Bad arguments
must get one line on stderr naming the flag and exit 2 before anything
runs, and an unwritable --json path must be refused up front. Asserts
behaviour, never speed.

bench/load_order, built beside it, must read every byte in each of its
four ways, print them and refuse bad arguments with exit 2; bench/kernel_l2
must give the scalar bits for a few types at 1 and 3 tokens and refuse bad
arguments with exit 2; bench/attn_bench must run and print the tile
--tile-bytes names and refuse bad arguments with exit 2.

usage: test_kernel_bench.py --bench BUILD/bench/kernel_bench
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness as H  # noqa: E402  (tests/)
result = H.Results()
check = result.check


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    a = ap.parse_args()
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    with tempfile.TemporaryDirectory(prefix="shoal-kb-") as tmp:
        for tokens in (1, 3):
            out = os.path.join(tmp, "kb%d.json" % tokens)
            r = subprocess.run([a.bench, "--types", "int4", "--pool-mb", "64", "--seconds", "0.05",
                                "--tokens", str(tokens), "--json", out],
                               capture_output=True, text=True, timeout=300, env=env)
            check(r.returncode == 0, "tokens=%d: exit 0 (got %d: %s)" % (tokens, r.returncode,
                                                                         r.stderr.strip()[-300:]))
            if r.returncode != 0:
                continue
            res = json.load(open(out))
            runs = res.get("runs", [])
            names = [x.get("kernels") for x in runs]
            check(len(runs) >= 1 and names[0] == "scalar",
                  "tokens=%d: tables measured, scalar first: %s" % (tokens, names))
            for x in runs:
                check(x.get("bits_equal_scalar") is True and x.get("passes", 0) >= 1 and
                      x.get("weight_gbs", 0) > 0 and x.get("tokens") == tokens,
                      "tokens=%d %s: scalar bits, %s passes, %.3f GB/s" % (
                          tokens, x.get("kernels"), x.get("passes"), x.get("weight_gbs", 0)))
                # the fastest pass is at least the mean of all passes
                check(x.get("best_pass_gbs", 0) >= x.get("weight_gbs", 1) * (1 - 1e-9),
                      "tokens=%d %s: best pass %.3f >= mean %.3f GB/s" % (
                          tokens, x.get("kernels"), x.get("best_pass_gbs", 0),
                          x.get("weight_gbs", 0)))
                # the paired read (default on): a read before every pass,
                # measured, no faster than 100x the best probe (a read that
                # skipped the pool would be thousands of times faster)
                pr, vp = x.get("paired_read_gbs_median", 0), x.get("vs_paired_read_median", 0)
                ram = max(res.get("ram_read_gbs", 0), 1e-9)
                check(0 < pr < 100 * ram and vp > 0 and x.get("read_xor") is not None,
                      "tokens=%d %s: paired read %.3f GB/s (probe %.3f), kernel %.3f of it" % (
                          tokens, x.get("kernels"), pr, ram, vp))
            check(res.get("ram_read_gbs", 0) > 0 and res.get("ram_triad_gbs", 0) > 0,
                  "tokens=%d: RAM probes measured (read %.1f, triad %.1f GB/s)" % (
                      tokens, res.get("ram_read_gbs", 0), res.get("ram_triad_gbs", 0)))
            check(("GB/s x tok" in r.stdout) == (tokens > 1), "tokens=%d: the table's unit" % tokens)
            # every table's line ends "<paired ratio> same"
            rows = [l.split() for l in r.stdout.splitlines() if l.startswith("int4 ")]
            check(len(rows) == len(runs) and
                  all(len(w) >= 2 and w[-1] == "same" and float(w[-2]) > 0 for w in rows),
                  "tokens=%d: each printed line has the paired-read ratio" % tokens)
        # --isa and --rounds: only the named tables, each once per round, a
        # probe between rounds, one summary per table
        def short_run(name, args):
            """A short scalar run with args; (completed process, JSON path)."""
            out = os.path.join(tmp, name)
            r = subprocess.run([a.bench, "--pool-mb", "64", "--seconds", "0.05", "--isa", "scalar",
                                "--json", out] + args,
                               capture_output=True, text=True, timeout=300, env=env)
            check(r.returncode == 0, "%s: exit 0 (got %d: %s)" % (
                " ".join(args), r.returncode, r.stderr.strip()[-300:]))
            return r, out

        r, out = short_run("kbr.json", ["--types", "int4a8", "--rounds", "3"])
        if r.returncode == 0:
            res = json.load(open(out))
            runs = res.get("runs", [])
            check([x.get("kernels") for x in runs] == ["scalar"] * 3 and
                  [x.get("round") for x in runs] == [0, 1, 2],
                  "--rounds 3: scalar timed in rounds 0, 1, 2 (%s)" % (
                      [(x.get("kernels"), x.get("round")) for x in runs]))
            check(len(res.get("ram_probes", [])) == 4 and
                  all(p.get("read_gbs", 0) > 0 for p in res.get("ram_probes", [])),
                  "--rounds 3: 4 RAM probes, each measured")
            summ = res.get("summary", [])
            ratios = sorted(x.get("vs_ram_read", 0) for x in runs)
            check(len(summ) == 1 and summ[0].get("rounds") == 3 and
                  abs(summ[0].get("vs_ram_read_median", -1) - ratios[1]) < 1e-12 and
                  summ[0].get("vs_ram_read_min") == ratios[0] and
                  summ[0].get("vs_ram_read_max") == ratios[2],
                  "--rounds 3: the summary is the median and range of the rounds' ratios")
            pr = sorted(x.get("vs_paired_read_median", 0) for x in runs)
            check(len(summ) == 1 and abs(summ[0].get("vs_paired_read_median", -1) - pr[1]) < 1e-12
                  and pr[0] > 0 and summ[0].get("vs_paired_read_min") == pr[0] and
                  summ[0].get("vs_paired_read_max") == pr[2],
                  "--rounds 3: the summary's paired-read ratio is the median of the rounds'")
            check("(range)" in r.stdout and "paired read" in r.stdout and
                  sum(l.startswith("int4a8 ") for l in r.stdout.splitlines()) == 1,
                  "--rounds 3: one printed line per table, with the range")
        # one pass (--seconds 0.001: the calibration pass is the measurement):
        # the paired ratio is then exactly the kernel's rate (x tokens) over
        # the read's, the tokens counted once
        r, out = short_run("kb1.json", ["--types", "int4", "--tokens", "3", "--seconds", "0.001"])
        if r.returncode == 0:
            x = (json.load(open(out)).get("runs") or [{}])[0]
            pr, vp, g = (x.get(k, 0) for k in ("paired_read_gbs_median", "vs_paired_read_median",
                                                "weight_gbs"))
            check(x.get("passes") == 1 and pr > 0 and abs(vp - g / pr) <= 1e-6 * vp,
                  "one pass at 3 tokens: paired ratio %.6f = kernel %.4f GB/s x tok / read %.4f "
                  "GB/s (passes %s)" % (vp, g, pr, x.get("passes")))
        # --paired-read off: no read between passes, no paired figures
        r, out = short_run("kboff.json", ["--types", "int4", "--paired-read", "off"])
        if r.returncode == 0:
            runs = json.load(open(out)).get("runs", [])
            check(len(runs) == 1 and runs[0].get("weight_gbs", 0) > 0 and
                  "vs_paired_read_median" not in runs[0] and
                  "paired_read_gbs_median" not in runs[0],
                  "--paired-read off: timed, without paired figures")
            rows = [l.split() for l in r.stdout.splitlines() if l.startswith("int4 ")]
            check(len(rows) == 1 and rows[0][-2:] == ["-", "same"],
                  "--paired-read off: '-' where the paired ratio goes (%s)" % rows)
        # --huge: the pool on 2 MiB pages by default, malloc's with off;
        # recorded in the JSON, the bits the same either way
        for hv, want in ((None, True), ("off", False), ("on", True)):
            r, out = short_run("kbh.json", ["--types", "int4"] + (["--huge", hv] if hv else []))
            if r.returncode == 0:
                res = json.load(open(out))
                runs = res.get("runs", [])
                check(res.get("huge_pages") is want and len(runs) >= 1 and
                      all(x.get("bits_equal_scalar") is True for x in runs),
                      "--huge %s: huge_pages %s in the JSON (%s), scalar bits" % (
                          hv or "(default)", want, res.get("huge_pages")))
        bad = [(["--group", "48"], "--group"), (["--huge", "yes"], "--huge"),
               (["--huge", ""], "--huge"),
               (["--paired-read", "yes"], "--paired-read"), (["--paired-read", ""], "--paired-read"),
               (["--isa", "bogus"], "--isa"), (["--isa", "scalar,scalar"], "--isa"),
               (["--isa", "auto"], "--isa"), (["--isa", ""], "--isa"),
               (["--rounds", "0"], "--rounds"), (["--rounds", "51"], "--rounds"), (["--types", "int4,int4"], "--types"),
               (["--types", ""], "--types"), (["--pool-mb", "1"], "--pool-mb"),
               (["--shape", "2048"], "--shape"), (["--shape", " 2048,768"], "--shape"),
               (["--shape", "2048,768x"], "--shape"), (["--types", "int4a8,int4a8"], "--types"),
               (["--types", "int4a8,"], "--types"), (["--types", ",int4"], "--types"),
               (["--tokens", "0"], "--tokens"),
               (["--seconds", "-1"], "--seconds"), (["--bogus"], "--bogus"),
               (["--threads"], "--threads"),
               (["--json", os.path.join(tmp, "no", "such", "dir.json")], "--json")]
        for args, flag in bad:
            # nothing on stdout: refused before any table was measured (not timed)
            r = subprocess.run([a.bench] + args, capture_output=True, text=True, timeout=300, env=env)
            lines = [l for l in r.stderr.splitlines() if l.startswith("kernel_bench:")]
            check(r.returncode == 2 and len(lines) == 1 and flag in lines[0] and not r.stdout,
                  "%s: exit 2 before measuring, one line naming %s (rc %d: %s%s)" % (
                      " ".join(args), flag, r.returncode, r.stderr.strip()[:200],
                      "; stdout: " + r.stdout[:100] if r.stdout else ""))
        # load_order (built beside kernel_bench): the four ways, each read
        # every byte (it checks the XORs itself), seq against itself is 1
        lo = os.path.join(os.path.dirname(a.bench), "load_order")
        out = os.path.join(tmp, "lo.json")
        r = subprocess.run([lo, "--pool-mb", "16", "--passes", "2", "--json", out],
                           capture_output=True, text=True, timeout=300)
        check(r.returncode == 0, "load_order: exit 0 (got %d: %s)" % (r.returncode,
                                                                      r.stderr.strip()[-300:]))
        if r.returncode == 0:
            ways = json.load(open(out)).get("ways", {})
            check(sorted(ways) == ["rows", "rows+pf", "seq", "seq+pf"] and
                  all(w.get("gbs_median", 0) > 0 for w in ways.values()) and
                  ways["seq"].get("vs_seq_median") == 1.0,
                  "load_order: four ways measured, seq = 1.0 (%s)" % ways)
        # odd shapes: one row at a time, rows whose bytes are not whole 32s
        for args in (["--rows", "1"], ["--rows", "3", "--row-bytes", "440"]):
            r = subprocess.run([lo, "--pool-mb", "16", "--passes", "1"] + args,
                               capture_output=True, text=True, timeout=300)
            check(r.returncode == 0 and "rows+pf" in r.stdout,
                  "load_order %s: every byte read (rc %d: %s)" % (" ".join(args), r.returncode,
                                                                  r.stderr.strip()[-200:]))
        for args, flag in [(["--rows", "0"], "--rows"), (["--row-bytes", "100"], "--row-bytes"),
                           (["--pool-mb"], "--pool-mb"), (["--bogus"], "--bogus"),
                           (["--json", "--passes", "1"], "--json"),
                           (["--rows", "64", "--row-bytes", "1048576", "--pool-mb", "16"],
                            "--pool-mb")]:
            r = subprocess.run([lo] + args, capture_output=True, text=True, timeout=60)
            lines = [l for l in r.stderr.splitlines() if l.startswith("load_order:")]
            check(r.returncode == 2 and len(lines) == 1 and flag in lines[0] and not r.stdout,
                  "load_order %s: exit 2, one line naming %s (rc %d: %s)" % (
                      " ".join(args), flag, r.returncode, r.stderr.strip()[:200]))
        # kernel_l2 (built beside kernel_bench): a few types at 1 and 3
        # tokens give the scalar bits; bad input exits 2 with one line
        kl = os.path.join(os.path.dirname(a.bench), "kernel_l2")
        for toks in ("1", "3"):
            r = subprocess.run([kl, "--types", "q4_k,q6_k,q2_k,iq2_xxs,q8_0", "--tokens", toks,
                                "--rows", "24", "--cols", "512", "--calls", "5"],
                               capture_output=True, text=True, timeout=120)
            lines = r.stdout.splitlines()
            check(r.returncode == 0 and len(lines) == 5 and
                  all(l.endswith("bits same") for l in lines),
                  "kernel_l2 --tokens %s: five types, the scalar bits (rc %d: %s%s)" % (
                      toks, r.returncode, r.stdout.strip()[-300:], r.stderr.strip()[-200:]))
        for args, what in [(["--types", "q9_z"], "q9_z"), (["--rows", "0"], "--rows"),
                           (["--types", "q4_k", "--cols", "100"], "256"),
                           (["--bogus", "1"], "--bogus"), (["--calls"], "--calls")]:
            r = subprocess.run([kl] + args, capture_output=True, text=True, timeout=60)
            lines = [l for l in r.stderr.splitlines() if l.startswith("kernel_l2:")]
            check(r.returncode == 2 and len(lines) == 1 and what in lines[0] and not r.stdout,
                  "kernel_l2 %s: exit 2, one line naming %s (rc %d: %s)" % (
                      " ".join(args), what, r.returncode, r.stderr.strip()[:200]))
        # attn_bench (built beside kernel_bench): --tile-bytes sets the tile
        # it runs and prints; bad input exits 2 with one line
        ab = os.path.join(os.path.dirname(a.bench), "attn_bench")
        for tb in ("1024", "16384"):
            r = subprocess.run([ab, "--ctx", "64", "--layers", "1", "--kv", "f32", "--seconds", "1",
                                "--threads", "1", "--tile-bytes", tb],
                               capture_output=True, text=True, timeout=120)
            lines = r.stdout.splitlines()
            row = lines[2].split() if len(lines) == 3 else []
            check(r.returncode == 0 and "tiles of %s bytes" % tb in lines[0] and
                  len(row) == 7 and row[0] == "64" and float(row[5]) > 0,
                  "attn_bench --tile-bytes %s: its tile, one row with a rate (rc %d: %s%s)" % (
                      tb, r.returncode, r.stdout.strip()[-300:], r.stderr.strip()[-200:]))
        for args in (["--tile-bytes", "100"], ["--tile-bytes", "x"], ["--ctx"]):
            r = subprocess.run([ab] + args, capture_output=True, text=True, timeout=60)
            lines = [l for l in r.stderr.splitlines() if l.startswith("attn_bench:")]
            check(r.returncode == 2 and len(lines) == 1 and args[0] in lines[0] and not r.stdout,
                  "attn_bench %s: exit 2, one line naming %s (rc %d: %s)" % (
                      " ".join(args), args[0], r.returncode, r.stderr.strip()[:200]))
    return result.summary()


if __name__ == "__main__":
    sys.exit(main())
