#!/usr/bin/python3
"""Smoke test of bench/sweep and `shoal bench` (so the scripts do not rot).

On a tiny synthetic container (`shoal synth`, built-in zipf routing, no
../shared needed), in seconds:
  1. a sweep over cache = 2 sizes x prefetch on/off, --repeat 1 --gen 4;
  2. with shoal-worker built, a sweep over workers = 0, 1 x local experts
     off, on on loopback (workers=0 local=off is skipped: no executor);
  3. `shoal bench` refusing bad input with a one-line error;
  4. the summary's noise rule, on synthetic runs rewritten by `--report`
     (no shoal needed): repeats that overlap name no winner, repeats
     clearly apart name the best, one repeat names none and says to
     repeat; summary.md, summary.json and configs.csv all say so and give
     each configuration's min / median / max and relative spread;
  5. --worker-port-base: the workers listen there, a bad value is one
     line and exit 2; `bench/sweep --help` gives every option a
     description and each option that takes a value its default;
  6. `shoal bench` on a GGUF file (the bundled model written by
     tests/cli/test_run_gguf.py's writer, Q4_K gate/up and Q8_0 down
     experts, BF16 trunk): the model described as the file holds it (types
     and bytes per type, expert bytes per layer, trunk bytes), fio on the
     file itself, the limits file accepted by fingerprint, a cold run
     evicting the file and reading experts from it, a warm run generating
     the same ids (DESIGN contract 1), --workers and a truncated file
     refused in one line, exit 2 (bad input, as shoal run).
Checks that runs.jsonl, runs.csv, the plots and summary.md exist and hold
sane values: every run succeeded, tok/s > 0, hit rates in [0, 1], the
per-token stages add up to the total, the CSV's ratios equal figure / limit
for the limits recorded in the same sweep, the limits are either measured
(> 0) or say why not (fio absent, ...), the generated tokens are identical
across configurations (DESIGN contract 1), and the PNGs are PNGs. Asserts
behaviour, never speed. Needs no root (the cold state then uses
posix_fadvise; the JSON says so).

usage: test_sweep_smoke.py --shoal BUILD/coordinator/shoal [--worker BUILD/worker/shoal-worker]
"""
import argparse
import csv
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness as H  # noqa: E402
SWEEP = os.path.join(ROOT, "bench", "sweep")
result = H.Results(quiet=True)
check = result.check


def close(a, b, rel=1e-6):
    return a is not None and b is not None and abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)


def num(s):
    return float(s) if s not in ("", None) else None


# output captured, 600 s, a passive OpenMP wait on 2 threads
run = functools.partial(H.run, timeout=600,
                        env={"OMP_WAIT_POLICY": "passive", "OMP_NUM_THREADS": "2"})


def synthetic_sweep(d, decode, ttft):
    """A sweep directory as `bench/sweep` leaves it, with made-up runs:
    decode / ttft: {cache value: [figure of each repeat]}."""
    os.makedirs(d)
    lim = os.path.join(d, "limits-start.json")
    with open(lim, "w") as fh:
        json.dump({"limits": {"ssd": {"mb_per_s": 1000.0}, "ram": {"read_gbs": 10.0,
                                                                    "triad_gbs": 8.0}},
                   "machine": {"cpu": "synthetic", "cores": 2, "ram_bytes": 2**33},
                   "model": {"fingerprint": "0123456789abcdef"}}, fh)
    n_rep = max(len(v) for v in decode.values())
    meta = {"command": "bench/sweep synthetic", "grid": [["cache", list(decode)]],
            "skipped": [], "limits_start": [[[None, None], lim]],
            "args": {"state": "cold", "repeat": n_rep, "reps": 1, "gen": 4,
                     "prompt_len": 8, "order": "alternate", "seed": 7, "netns": False,
                     "link_rate": None, "disk_bps": None, "extra": []}}
    with open(os.path.join(d, "sweep.json"), "w") as fh:
        json.dump(meta, fh)
    order = 0
    with open(os.path.join(d, "runs.jsonl"), "w") as fh:
        for rep in range(n_rep):
            for c in decode:
                if rep >= len(decode[c]):
                    continue
                res = {"commit": "synthetic", "generated_ids_xxh64": "00000000deadbeef",
                       "summary": {"decode_tok_s": {"median": decode[c][rep]},
                                   "ttft_ms": {"median": ttft[c][rep]},
                                   "ms_per_token": {"median": 1000.0 / decode[c][rep]}},
                       "sweep": {"config": {"cache": c}, "name": "cache=" + c,
                                 "repeat": rep, "order": order, "rc": 0, "wall_s": 1.0,
                                 "log": "none"}}
                order += 1
                fh.write(json.dumps(res) + "\n")


def check_noise_rule(tmp):
    """The summary names a best configuration only outside the noise."""
    cases = {
        # name: decode and TTFT of each repeat; the decode and TTFT winners
        "overlap": ({"1M": [10.0, 12.0, 14.0], "4M": [11.0, 12.5, 13.0]},
                    {"1M": [100.0, 110.0, 120.0], "4M": [105.0, 108.0, 125.0]}, None, None),
        "apart": ({"1M": [10.0, 11.0, 12.0], "4M": [20.0, 21.0, 22.0]},
                  {"1M": [300.0, 310.0, 320.0], "4M": [100.0, 101.0, 102.0]},
                  "cache=4M", "cache=4M"),
        "one-repeat": ({"1M": [10.0], "4M": [20.0]}, {"1M": [300.0], "4M": [100.0]},
                       None, None),
    }
    for case, (decode, ttft, win, win_ttft) in cases.items():
        d = os.path.join(tmp, "noise-" + case)
        synthetic_sweep(d, decode, ttft)
        r = run([sys.executable, SWEEP, "--report", d, "--no-plots"])
        check(r.returncode == 0, "%s: --report exited %d: %s" % (case, r.returncode,
                                                                 r.stderr[-1000:]))
        md = open(os.path.join(d, "summary.md")).read() if r.returncode == 0 else ""
        dec = [ln for ln in md.splitlines() if ln.startswith("- decode:")]
        ttl = [ln for ln in md.splitlines() if ln.startswith("- time to first token:")]
        sj, rows = {}, {}
        try:
            sj = json.load(open(os.path.join(d, "summary.json")))
            rows = {x["config"]: x for x in csv.DictReader(open(os.path.join(d, "configs.csv")))}
        except (OSError, ValueError) as e:
            check(False, "%s: summary.json / configs.csv: %s" % (case, e))
        rk = sj.get("rankings", {})
        check(rk.get("decode", {}).get("winner") == win,
              "%s: summary.json decode winner %s, expected %s" % (
                  case, rk.get("decode", {}).get("winner"), win))
        check(rk.get("ttft", {}).get("winner") == win_ttft,
              "%s: summary.json TTFT winner %s, expected %s" % (
                  case, rk.get("ttft", {}).get("winner"), win_ttft))
        if win:
            check(len(dec) == 1 and dec[0].startswith("- decode: **%s**" % win) and
                  "no winner" not in dec[0],
                  "%s: summary.md should name %s for decode: %s" % (case, win, dec))
            check(len(ttl) == 1 and ttl[0].startswith("- time to first token: **%s**" %
                                                      win_ttft),
                  "%s: summary.md should name %s for TTFT: %s" % (case, win_ttft, ttl))
            verdicts = [rows.get("cache=" + c, {}).get("decode_verdict") for c in ("4M", "1M")]
            check(verdicts == ["winner", "beaten by the best"],
                  "%s: configs.csv decode verdicts %s" % (case, verdicts))
        else:
            for ln in dec + ttl:
                check("no winner" in ln and "**cache=" not in ln,
                      "%s: summary.md names a winner inside the noise: %s" % (case, ln))
            check(len(dec) == 1 and len(ttl) == 1, "%s: summary.md verdicts %s %s" % (
                case, dec, ttl))
            want = "one repeat" if case == "one-repeat" else "within the noise"
            check(all(want in ln for ln in dec + ttl) and
                  want in (rk.get("decode", {}).get("reason") or ""),
                  "%s: the verdict does not say '%s': %s" % (case, want, dec + ttl))
            if case == "one-repeat":
                check(all("--repeat" in ln for ln in dec + ttl),
                      "one repeat: no hint to repeat: %s" % dec)
            else:
                check(rk.get("decode", {}).get("within_noise") == ["cache=1M"],
                      "overlap: within_noise %s" % rk.get("decode", {}).get("within_noise"))
        # every configuration's spread of the ranked figure, in the JSON and the CSV
        for c, xs in decode.items():
            lo, hi, mid = min(xs), max(xs), sorted(xs)[len(xs) // 2]
            j = next((x for x in sj.get("configurations", []) if x["config"] == "cache=" + c),
                     {}).get("decode", {})
            spread = j.get("rel_spread")
            check((j.get("repeats"), j.get("min"), j.get("median"), j.get("max")) ==
                  (len(xs), lo, mid, hi) and
                  (close(spread, (hi - lo) / mid) if hi > lo else spread == 0),
                  "%s cache=%s: summary.json decode spread %s, expected %s" % (case, c, j, xs))
            row = rows.get("cache=" + c, {})
            check(close(num(row.get("decode_tok_s_min")), lo) and
                  close(num(row.get("decode_tok_s_max")), hi) and
                  close(num(row.get("decode_tok_s")), mid) and
                  num(row.get("decode_tok_s_n")) == len(xs),
                  "%s cache=%s: configs.csv decode spread %s" % (case, c, row))
        check("spread %" in md, "%s: summary.md's table lacks the spread column" % case)


def check_options(model, shoal, tmp):
    """Every option has help text (and its default); a bad --worker-port-base
    is one line and exit 2."""
    r = run([sys.executable, SWEEP, "--help"])
    check(r.returncode == 0, "--help exited %d" % r.returncode)
    text = r.stdout.split("\noptions:", 1)[-1]
    entries, cur = [], None
    for ln in text.splitlines():
        if ln.startswith("  -"):
            cur = [ln.strip()]
            entries.append(cur)
        elif cur is not None and ln.startswith("    "):
            cur.append(ln.strip())
    check(len(entries) >= 20, "--help lists %d options" % len(entries))
    for e in entries:
        opt = e[0].split()[0].rstrip(",")
        if opt == "-h":
            continue
        # "--opt VALUE   what it does" on one line, or the text on the next lines
        head = e[0].split("  ", 1)
        desc = " ".join(([head[1].strip()] if len(head) > 1 else []) + e[1:]).strip()
        check(desc != "", "bench/sweep --help: %s has no description" % opt)
        takes_value = len(e[0].split("  ", 1)[0].split()) > 1
        check(not takes_value or "default" in desc,
              "bench/sweep --help: %s does not give its default: %s" % (opt, desc))
    check("--worker-port-base" in r.stdout, "--help lacks --worker-port-base")
    for bad in ("abc", "0", "65536", "-3", "65535"):
        r = run([sys.executable, SWEEP, "--model", model, "--shoal", shoal, "--out",
                 os.path.join(tmp, "badport"), "--worker-port-base", bad, "workers=0,2"])
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        check(r.returncode == 2 and len(lines) == 1 and
              lines[0].startswith("bench/sweep: --worker-port-base"),
              "--worker-port-base %s: exit %d, expected 2 and one line: %s" % (
                  bad, r.returncode, r.stderr))
    check(not os.path.exists(os.path.join(tmp, "badport")), "a refused sweep wrote --out")


def check_paired(model, shoal, tmp):
    """`shoal bench` with limits measured now probes RAM again after every
    repetition and sets each repetition's RAM ratios against the better
    read probe beside it: recomputed here from the JSON's own figures.
    --paired-ram off leaves the probes out; a bad value is one line, exit 2."""
    common = [shoal, "bench", "--model", model, "--state", "warm", "--gen", "4",
              "--prompt-len", "8", "--fio-runtime", "1", "--ram-mb", "16", "--ram-reps", "2"]
    jp = os.path.join(tmp, "paired.json")
    r = run(common + ["--reps", "3", "--json", jp])
    check(r.returncode == 0, "bench --paired-ram (default on): exit %d: %s" % (r.returncode,
                                                                           r.stderr[-2000:]))
    if r.returncode != 0:
        return
    j = json.load(open(jp))
    runs = j["runs"]
    probes = [j["limits"]["ram"]["read_gbs"]] + [x.get("ram_after", {}).get("read_gbs")
                                                  for x in runs]
    check(len(runs) == 3 and all((p or 0) > 0 for p in probes),
          "a read probe before and after every repetition: %s" % probes)
    if not all((p or 0) > 0 for p in probes):
        return
    rat = []
    for k, x in enumerate(runs):
        f = x["figures"]
        lim = max(probes[k], probes[k + 1]) * 1e3 / f["token_read_mb"]
        rat.append(f["decode_tok_s"] / lim)
    b = j["ratios"]["decode_vs_ram_bound"]
    per = b.get("ratio_per_rep") or []
    check(len(per) == 3 and all(close(x, y) for x, y in zip(per, rat)),
          "each repetition's ratio %s, recomputed %s" % (per, rat))
    check(close(b["ratio"], sorted(rat)[1]) and close(b["ratio_min"], min(rat)) and
          close(b["ratio_max"], max(rat)) and "paired" in b,
          "paired decode ratio %s, recomputed %s" % (b, rat))
    check(close(b["probe_read_gbs_min"], min(probes)) and
          close(b["probe_read_gbs_max"], max(probes)),
          "probe range %s .. %s, expected %s" % (b.get("probe_read_gbs_min"),
                                                 b.get("probe_read_gbs_max"), probes))
    ec = j["ratios"]["expert_compute_vs_ram"]
    erat = sorted(x["figures"]["expert_compute_mb_s"] / (max(probes[k], probes[k + 1]) * 1e3)
                  for k, x in enumerate(runs))
    check(close(ec["ratio"], erat[1]), "paired expert ratio %s, recomputed %s" % (ec, erat))
    check("each rep against the better read probe beside it" in r.stdout,
          "the report does not say the ratio is paired: %s" % r.stdout[-1500:])
    r = run(common + ["--reps", "1", "--paired-ram", "off", "--json", jp])
    check(r.returncode == 0, "--paired-ram off: exit %d: %s" % (r.returncode, r.stderr[-2000:]))
    if r.returncode == 0:
        j = json.load(open(jp))
        b = j["ratios"]["decode_vs_ram_bound"]
        f = j["runs"][0]["figures"]
        lim = j["limits"]["ram"]["read_gbs"] * 1e3 / f["token_read_mb"]
        check("ram_after" not in j["runs"][0] and "paired" not in b and
              close(b["ratio"], f["decode_tok_s"] / lim),
              "--paired-ram off: %s against the one probe (%s)" % (b, lim))
    r = run(common + ["--paired-ram", "maybe"])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    check(r.returncode == 2 and len(lines) == 1 and "--paired-ram" in lines[0],
          "--paired-ram maybe: exit %d, %s" % (r.returncode, r.stderr))


def check_gguf(shoal, tmp):
    """`shoal bench --model FILE.gguf`: describe, limits, cold and warm."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "cli"))
    import test_run_gguf as G
    cfg = json.load(open(os.path.join(G.MODEL, "config.json")))
    st = G.read_safetensors(os.path.join(G.MODEL, "model.safetensors"))
    L, E = cfg["num_hidden_layers"], cfg["num_experts"]
    tensors = [(n, x, "Q8_0" if "ffn_down_exps" in n else t)
               for n, x, t in G.typed(G.gguf_tensors(st, L, E), matrix_type="BF16",
                                      expert_type="Q4_K")]
    path = os.path.join(tmp, "bench.gguf")
    G.write_gguf(path, G.metadata(cfg), tensors)
    types, exps = {}, {}
    for n, x, t in tensors:
        nb = len(G.encode(x, t))
        for d in (types, exps) if "_exps." in n else (types,):
            e = d.setdefault(t, {"tensors": 0, "bytes": 0})
            e["tensors"] += 1
            e["bytes"] += nb
    per_expert = sum(v["bytes"] for v in exps.values()) // (L * E)
    common = ["--model", path, "--fio-runtime", "1", "--ram-mb", "16"]
    lim = os.path.join(tmp, "gguf-limits.json")
    r = run([shoal, "bench"] + common + ["--limits-only", "--json", lim])
    check(r.returncode == 0, "bench --limits-only on a GGUF: exit %d: %s" % (r.returncode,
                                                                          r.stderr[-1000:]))
    if r.returncode != 0:
        return
    j = json.load(open(lim))
    m = j["model"]
    check(m["format"] == "gguf" and m["files"] == [path] and m["architecture"] == "qwen3moe" and
          re.fullmatch(r"[0-9a-f]{16}", m["fingerprint"] or "") and m["n_moe_layer"] == L and
          m["n_expert"] == E, "GGUF model described: %s" % {k: m.get(k) for k in (
              "format", "files", "architecture", "fingerprint", "n_moe_layer", "n_expert")})
    check(m["types"] == types and m["experts_types"] == exps and m["experts_dtype"] == "mixed",
          "GGUF types %s and expert types %s, expected %s and %s" % (
              m["types"], m["experts_types"], types, exps))
    check(m["experts_bytes"] == sum(v["bytes"] for v in exps.values()) and
          m["dense_bytes"] == sum(v["bytes"] for v in types.values()) - m["experts_bytes"] and
          m["experts_file_bytes"] == os.path.getsize(path) and m["blob_bytes"] is None,
          "GGUF bytes: experts %s, trunk %s, file %s" % (m["experts_bytes"], m["dense_bytes"],
                                                         m["experts_file_bytes"]))
    # every layer the same types: mean = max = one expert's bytes; its
    # reads are whole 4 KiB pages around each of its 3 matrices
    check(m["expert_bytes_mean"] == per_expert and m["expert_bytes_max"] == per_expert and
          per_expert < m["expert_read_bytes_mean"] <= m["expert_read_bytes_max"] <=
          per_expert + 3 * 2 * 4096 and m["expert_read_bytes_max"] % 4096 == 0,
          "GGUF expert bytes %d per expert: %s" % (per_expert, {
              k: v for k, v in m.items() if k.startswith("expert_")}))
    ssd = j["limits"]["ssd"]
    check(("fio" in (ssd.get("skipped") or "")) or
          ((ssd.get("mb_per_s") or 0) > 0 and "--filename=%s " % path in ssd.get("cmd", "") and
           ssd.get("bs", 0) % 4096 == 0 and 0 < ssd["bs"] < per_expert),
          "fio on the GGUF file, one expert matrix per read: %s" % ssd)
    ids = {}
    for state in ("cold", "warm"):
        jp = os.path.join(tmp, "gguf-%s.json" % state)
        r = run([shoal, "bench"] + common + ["--state", state, "--reps", "1", "--gen", "4",
                                             "--prompt-len", "8", "--limits", lim,
                                             "--expert-cache", "1M", "--json", jp])
        check(r.returncode == 0, "bench --state %s on a GGUF: exit %d: %s" % (
            state, r.returncode, r.stderr[-1000:]))
        if r.returncode != 0:
            continue
        j = json.load(open(jp))
        f = j["runs"][0]["figures"]
        ids[state] = j["generated_ids_xxh64"]
        check(j["model"]["fingerprint"] == m["fingerprint"] and
              0 <= f["hit_rate"] <= 1 and f["expert_compute_mb_s"] > 0 and
              j["runs"][0]["store"]["disk_reads"] + j["runs"][0]["store"]["cache_hits"] > 0,
              "GGUF %s run: fingerprint %s, figures %s" % (state, j["model"]["fingerprint"], f))
        rat = j["ratios"]["expert_read_vs_ssd"]
        if rat["ratio"] is not None:
            check(close(rat["ratio"], rat["figure"] / rat["limit"]), "GGUF ratio %s" % rat)
        if state == "cold":
            # the disk bound: with a 1M cache no expert fits, so a decode token
            # reads at least every expert it acquires, and tok/s against fio / that
            db = j["ratios"]["decode_vs_disk_bound"]
            check(f["decode_least_read_mb_per_token"] > 0 and f["decode_read_mb_per_token"] > 0 and
                  (db["ratio"] is None or (close(db["ratio"], db["figure"] / db["limit"]) and
                                           close(db["limit"], db["fio_mb_s"] / db["least_read_mb_per_token"]))),
                  "GGUF cold: the disk bound %s, figures %s" % (db, f))
            ev = j["state"]["evictions"][0]
            check(ev.get("resident_file") == path and f["expert_read_mb"] > 0,
                  "GGUF cold: the file evicted (%s), experts read from it (%s MB)" % (
                      ev, f["expert_read_mb"]))
    check(len(ids) == 2 and ids["cold"] == ids["warm"],
          "GGUF cold and warm runs generate the same ids: %s" % ids)
    # refused before anything is measured: one line, exit 2 / 1, no JSON
    bad = os.path.join(tmp, "truncated.gguf")
    with open(path, "rb") as fi, open(bad, "wb") as fo:
        fo.write(fi.read()[:os.path.getsize(path) // 2])
    for args, code, word in ((["--model", path, "--workers", "127.0.0.1:1"], 2, "--workers"),
                             (["--model", bad], 2, "truncated.gguf")):
        jp = os.path.join(tmp, "gguf-bad.json")
        r = run([shoal, "bench", "--json", jp] + args)
        errs = [ln for ln in r.stderr.splitlines() if ln.startswith("shoal: ")]
        check(r.returncode == code and len(errs) == 1 and word in errs[0] and
              not os.path.exists(jp), "bench %s: exit %d (expected %d), one line naming '%s': %s"
              % (" ".join(args[2:]) or args[1], r.returncode, code, word, r.stderr))


def check_sweep(out, n_runs, grid_keys):
    # runs.jsonl: one full `shoal bench` JSON per run
    lines = open(os.path.join(out, "runs.jsonl")).read().splitlines()
    check(len(lines) == n_runs, "%s: %d runs in runs.jsonl, expected %d" % (out, len(lines), n_runs))
    ids = set()
    for ln in lines:
        j = json.loads(ln)
        name = j.get("sweep", {}).get("name")
        check(j.get("sweep", {}).get("rc") == 0, "%s: run %s failed: %s" % (
            out, name, j.get("error") or j.get("sweep", {}).get("log")))
        for k in ("commit", "command", "machine", "model", "config", "state", "prompts",
                  "runs", "summary", "limits", "ratios"):
            check(k in j, "%s: run %s lacks '%s'" % (out, name, k))
        m = j.get("machine", {})
        check(m.get("cores", 0) >= 1 and m.get("ram_bytes", 0) > 0,
              "machine: cores %s, ram %s" % (m.get("cores"), m.get("ram_bytes")))
        check(len(j.get("model", {}).get("fingerprint") or "") == 16, "model fingerprint missing")
        st = j.get("state", {})
        check(st.get("name") == "cold", "state %s, expected cold" % st.get("name"))
        for ev in st.get("evictions", []):
            check(ev.get("method") in ("drop_caches", "fadvise"),
                  "eviction method %s" % ev.get("method"))
            if ev.get("method") == "fadvise":
                check(bool(ev.get("why")), "fadvise eviction without saying why")
        lim = j.get("limits", {})
        ssd, ram = lim.get("ssd", {}), lim.get("ram", {})
        check((ssd.get("mb_per_s") or 0) > 0 or ssd.get("skipped") or ssd.get("error"),
              "ssd limit neither measured nor explained: %s" % ssd)
        check((ram.get("read_gbs") or 0) > 0, "RAM probe: %s" % ram)
        s = j.get("summary", {})
        for k in ("ttft_ms", "prefill_tok_s", "decode_tok_s", "ms_per_token"):
            v = (s.get(k) or {}).get("median")
            check(v is not None and v > 0, "%s: %s = %s, expected > 0" % (name, k, v))
        local = j.get("config", {}).get("local_experts", True)
        for k in ("hit_rate", "hit_pinned", "hit_cache", "hit_inflight", "miss_disk"):
            v = (s.get(k) or {}).get("median")
            check((v is None and not local) or (v is not None and 0 <= v <= 1),
                  "%s: %s = %s, expected in [0, 1]" % (name, k, v))
        if j.get("config", {}).get("workers"):
            for k in ("worker_hit_rate", "hit_rate_all"):
                v = (s.get(k) or {}).get("median")
                # with local experts on, placement may give a worker nothing
                # on a model this small (the local store is the faster
                # holder): its hit rate is then undefined (null)
                idle_ok = k == "worker_hit_rate" and local and v is None
                check(idle_ok or (v is not None and 0 <= v <= 1),
                      "%s: %s = %s, expected in [0, 1]" % (name, k, v))
        for k in ("prefetch_precision", "prefetch_recall"):
            v = (s.get(k) or {}).get("median")
            check(v is None or 0 <= v <= 1, "%s: %s = %s" % (name, k, v))
        hr = sum((s.get(k) or {}).get("median", 0) for k in
                 ("hit_pinned", "hit_cache", "hit_inflight", "miss_disk"))
        check(close(hr, 1.0, 1e-9) or not local, "%s: tiers sum to %s, expected 1" % (name, hr))
        for r in j.get("runs", []):
            f = r.get("figures", {})
            stages = sum(f.get(k) or 0 for k in ("ms_attention", "ms_routing", "ms_expert_wait",
                                                 "ms_expert_compute", "ms_network", "ms_combine",
                                                 "ms_head", "ms_other"))
            check(close(stages, f.get("ms_per_token"), 1e-6),
                  "%s: stages %.6f ms != total %s ms" % (name, stages, f.get("ms_per_token")))
            check((f.get("peak_rss_mb") or 0) > 0, "%s: peak RSS %s" % (name, f.get("peak_rss_mb")))
            check(r.get("generated_tokens", 0) > 0, "%s: no generated tokens" % name)
        rat = j.get("ratios", {}).get("expert_read_vs_ssd", {})
        if rat.get("ratio") is not None:
            check(close(rat["ratio"], rat["figure"] / rat["limit"]), "run ratio != figure / limit")
        ids.add(j.get("generated_ids_xxh64"))
    check(len(ids) == 1, "%s: generated tokens differ across configurations: %s" % (out, ids))

    # runs.csv: one row per run; ratios from the sweep's limits
    rows = list(csv.DictReader(open(os.path.join(out, "runs.csv"))))
    check(len(rows) == n_runs, "%d CSV rows, expected %d" % (len(rows), n_runs))
    for r in rows:
        for k in grid_keys + ["config", "decode_tok_s", "hit_rate", "ratio_read_vs_ssd",
                              "ratio_compute_vs_ram", "sweep_limit_ssd_mb_s"]:
            check(k in r, "CSV lacks column %s" % k)
        check((num(r.get("decode_tok_s")) or 0) > 0, "CSV decode_tok_s %s" % r.get("decode_tok_s"))
        lim, fig, rt = (num(r.get("sweep_limit_ssd_mb_s")), num(r.get("expert_read_mb_s")),
                        num(r.get("ratio_read_vs_ssd")))
        if lim and fig is not None:
            check(close(rt, fig / lim), "CSV ratio_read_vs_ssd %s != %s / %s" % (rt, fig, lim))
        else:
            check(rt is None, "a ratio without a limit or a figure: %s" % rt)
        lim, fig, rt = (num(r.get("sweep_limit_ram_read_mb_s")), num(r.get("expert_compute_mb_s")),
                        num(r.get("ratio_compute_vs_ram")))
        check(lim and close(rt, fig / lim) if fig is not None else rt is None,
              "CSV ratio_compute_vs_ram %s != %s / %s" % (rt, fig, lim))

    # limits of both passes and the summary that reports their median
    lims = json.load(open(os.path.join(out, "limits.json")))
    check(len(lims) >= 1, "limits.json is empty")
    summary = open(os.path.join(out, "summary.md")).read()
    for want in ("# Sweep summary", "## Limits", "## Best configuration", "read / fio",
                 "compute / RAM read", "generated tokens identical in every run: yes"):
        check(want in summary, "summary.md lacks '%s'" % want)
    # one repeat per configuration: no winner, and the summary says why
    for line in [ln for ln in summary.splitlines() if ln.startswith("- decode:")]:
        check("no winner" in line and "one repeat" in line and "--repeat" in line,
              "%s: one repeat, yet the summary says: %s" % (out, line))
    try:
        rk = json.load(open(os.path.join(out, "summary.json")))["rankings"]["decode"]
        check(rk["winner"] is None and rk["best"] and "one repeat" in rk["reason"],
              "%s: summary.json decode ranking %s" % (out, rk))
        crows = list(csv.DictReader(open(os.path.join(out, "configs.csv"))))
        check(len(crows) == len(set(r["config"] for r in rows)) and
              all(r["decode_tok_s_n"] == "1" for r in crows),
              "%s: configs.csv %s" % (out, crows))
    except (OSError, KeyError, ValueError) as e:
        check(False, "%s: summary.json / configs.csv: %r" % (out, e))
    v = next(iter(lims.values()))
    if v.get("ram_read_mb_s"):
        check("%.0f" % v["ram_read_mb_s"] in summary, "summary.md does not report the RAM limit")

    # plots
    pdir = os.path.join(out, "plots")
    if os.path.exists(os.path.join(out, "plots-skipped.txt")):
        print("plots skipped: %s" % open(os.path.join(out, "plots-skipped.txt")).read().strip())
    else:
        pngs = sorted(p for p in os.listdir(pdir) if p.endswith(".png"))
        check(len(pngs) >= 3, "%d plots in %s, expected >= 3" % (len(pngs), pdir))
        for p in pngs:
            b = open(os.path.join(pdir, p), "rb").read()
            check(b[:8] == b"\x89PNG\r\n\x1a\n" and len(b) > 5000, "%s is not a sane PNG" % p)
            check(p in summary, "summary.md does not show %s" % p)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--worker", default=None)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    shoal = os.path.abspath(a.shoal)
    tmp = tempfile.mkdtemp(prefix="shoal-sweep-smoke-")
    try:
        model = os.path.join(tmp, "tiny")
        r = run([shoal, "synth", model, "--gb", "0.01", "--trace", "zipf", "--seed", "3"])
        if r.returncode != 0:
            print("FAIL: shoal synth: %s" % r.stderr, file=sys.stderr)
            return 1
        check_noise_rule(tmp)
        check_options(model, shoal, tmp)
        check_paired(model, shoal, tmp)
        check_gguf(shoal, tmp)
        common = ["--model", model, "--shoal", shoal, "--repeat", "1", "--gen", "4",
                  "--prompt-len", "8", "--fio-runtime", "1", "--ram-mb", "16"]
        out = os.path.join(tmp, "sweep")
        r = run([sys.executable, SWEEP] + common + ["--out", out, "cache=1M,4M", "prefetch=on,off"])
        check(r.returncode == 0, "sweep exited %d: %s" % (r.returncode, r.stderr[-2000:]))
        if r.returncode == 0:
            check_sweep(out, 4, ["cache", "prefetch"])
            check("Best configuration" in r.stdout, "the sweep did not print its summary")

        worker = a.worker or os.path.join(os.path.dirname(os.path.dirname(shoal)), "worker",
                                          "shoal-worker")
        if os.access(worker, os.X_OK):
            out = os.path.join(tmp, "sweep-workers")
            port = H.free_port()
            r = run([sys.executable, SWEEP] + common + ["--out", out, "--worker", worker,
                                                        "--worker-port-base", str(port),
                                                        "workers=0,1", "local=off,on"])
            check(r.returncode == 0, "cluster sweep exited %d: %s" % (r.returncode,
                                                                      r.stderr[-2000:]))
            if r.returncode == 0:
                rows = check_sweep(out, 3, ["workers", "local"])
                wlogs = [p for p in os.listdir(os.path.join(out, "logs")) if "-w0" in p]
                check(len(wlogs) == 2 and all(
                    re.search(r"listening on 127\.0\.0\.1:%d\b" % port,
                              open(os.path.join(out, "logs", p)).read())
                    for p in wlogs), "--worker-port-base %d: workers %s did not listen there" % (
                        port, wlogs))
                for row in rows:
                    if row["workers"] == "1":
                        check((num(row.get("limit_link_mb_s")) or 0) > 0,
                              "workers=1: no link limit measured")
                    if row["workers"] == "1" and row["local"] == "off":
                        check((num(row.get("wire_mb_s")) or 0) > 0,
                              "workers=1 local=off: no bytes on the wire")
            left = run(["pgrep", "-f", "shoal-worker --model " + model])
            check(left.stdout.strip() == "", "workers left running: %s" % left.stdout)
        else:
            print("cluster sweep skipped: %s not built" % worker)

        # no fio on PATH: the SSD limit says why, the rest is measured
        jp = os.path.join(tmp, "nofio.json")
        env_path = os.path.join(tmp, "emptybin")
        os.makedirs(env_path, exist_ok=True)
        r = subprocess.run([shoal, "bench", "--model", model, "--reps", "1", "--gen", "2",
                            "--prompt-len", "4", "--fio-runtime", "1", "--ram-mb", "16",
                            "--json", jp], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, PATH=env_path, OMP_WAIT_POLICY="passive"))
        check(r.returncode == 0, "bench without fio: exit %d: %s" % (r.returncode, r.stderr))
        if r.returncode == 0:
            j = json.load(open(jp))
            check("fio" in (j["limits"]["ssd"].get("skipped") or ""),
                  "without fio: ssd limit %s" % j["limits"]["ssd"])
            check(j["ratios"]["expert_read_vs_ssd"]["ratio"] is None, "a ratio without fio")

        # not root: the cold state is made with posix_fadvise and says so
        if os.geteuid() == 0 and shutil.which("setpriv"):
            os.chmod(tmp, 0o755)
            nob = os.path.join(tmp, "nobody")
            os.makedirs(nob, exist_ok=True)
            os.chmod(nob, 0o777)
            jp = os.path.join(nob, "nobody.json")
            r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                shoal, "bench", "--model", model, "--reps", "1", "--gen", "2",
                                "--prompt-len", "4", "--limits", "off", "--json", jp],
                               capture_output=True, text=True, timeout=300, cwd=nob,
                               env=dict(os.environ, HOME=nob, XDG_CACHE_HOME=nob,
                                        OMP_WAIT_POLICY="passive"))
            check(r.returncode == 0, "bench as nobody: exit %d: %s" % (r.returncode, r.stderr))
            if r.returncode == 0:
                ev = json.load(open(jp))["state"]["evictions"][0]
                check(ev["method"] == "fadvise" and "not root" in ev.get("why", "") and
                      ev.get("resident_after") is None and ev.get("resident_unknown"),
                      "as nobody: eviction %s" % ev)
        else:
            # not root already: the sweep above took the fadvise path
            print("not-root check skipped: %s" % ("not root already" if os.geteuid() else
                                                  "no setpriv"))

        # bad input: one line, exit 2 (usage: a named input file that does not
        # exist is a bad flag value, as USAGE.md says of --file), nothing written
        for args, code in ((["--state", "hot"], 2), (["--gen", "0"], 2),
                           (["--limits", os.path.join(tmp, "nope.json")], 2),
                           (["--prompts", os.path.join(tmp, "nope.txt")], 2)):
            jp = os.path.join(tmp, "bad.json")
            r = run([shoal, "bench", "--model", model, "--json", jp] + args)
            errs = [ln for ln in r.stderr.splitlines() if ln.startswith("shoal: ") and
                    "no --json" not in ln]
            check(r.returncode == code, "bench %s: exit %d, expected %d" % (args, r.returncode, code))
            check(len(errs) == 1 and not os.path.exists(jp),
                  "bench %s: expected one error line and no JSON, got %s" % (args, r.stderr))
    finally:
        if a.keep:
            print("kept %s" % tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return result.summary("sweep smoke")


if __name__ == "__main__":
    sys.exit(main())
