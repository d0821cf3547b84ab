#!/usr/bin/python3
"""Smoke test of bench/serve_bench.py (so the benchmark does not rot).

A tiny synthetic model with its experts on disk, 1 and 2 streams, one short
request each, both cache policies: exit 0; a table row per stream count,
policy, mode and phase, each with a bound and a ratio; a JSON in which
every phase has a bound (positive tok/s, decode steps counted, the limits
measured around its server) and both policies ran; the comparison of the
policies printed. Skips when fio is missing (the disk's limit). Asserts
behaviour, never speed.

usage: test_serve_bench.py --shoal BUILD/coordinator/shoal
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # tests/: harness
import harness as H  # noqa: E402
BENCH = os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench", "serve_bench.py")
result = H.Results(skips=True)
check = result.check


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    a = ap.parse_args()
    if not shutil.which("fio"):
        result.skip("serve_bench", "fio is not installed")
        return result.summary()
    with tempfile.TemporaryDirectory(prefix="shoal-serveb-") as tmp:
        out = os.path.join(tmp, "r.json")
        r = subprocess.run([sys.executable, BENCH, "--shoal", a.shoal, "--gb", "0.02",
                            "--workdir", tmp, "--streams", "1,2", "--requests", "1",
                            "--prompt-len", "8", "--max-tokens", "4", "--cache-frac", "0.25",
                            "--fio-runtime", "1", "--cache-policy", "lru,freq", "--json", out],
                           capture_output=True, text=True, timeout=900)
        check(r.returncode == 0, "exit 0 (rc %d: %s)" % (r.returncode, r.stderr.strip()[-500:]))
        rows = [l.split() for l in r.stdout.splitlines() if l[:1].isdigit()]
        # 1 stream: serial per policy; 2 streams: serial and together per policy
        check(len(rows) == 2 * (2 + 4), "a table row per configuration and phase: %d" % len(rows))
        check(all(len(x) >= 7 and x[5] != "n/a" and x[6] != "n/a" for x in rows),
              "every row has a bound and a ratio: %s" % rows[:2])
        check("cache policies against lru" in r.stdout and "freq" in r.stdout,
              "the policies compared")
        if r.returncode != 0:
            return result.summary()
        res = json.load(open(out))
        check(res.get("policies") == ["lru", "freq"], "JSON: both policies")
        check((res.get("token_dense_read_mb") or 0) > 0 and (res.get("expert_compute_mb") or 0) > 0,
              "JSON: shoal bench's dense MB a step and MB an expert")
        runs = res.get("runs", [])
        check(sorted((x["streams"], x["policy"]) for x in runs) ==
              [(1, "freq"), (1, "lru"), (2, "freq"), (2, "lru")], "JSON: a run per streams x policy")
        for x in runs:
            for mode in ("serial", "together"):
                lim = x[mode].get("limits") or {}
                check((lim.get("ram_read_gbs") or 0) > 0 and (lim.get("fio_mb_s") or 0) > 0 and
                      len(lim.get("passes", [])) == 2,
                      "%d streams %s %s: limits around the server" % (x["streams"], x["policy"], mode))
                for phase in ("cold", "warm"):
                    b = x[mode][phase].get("bound") or {}
                    dec = (b.get("kinds") or {}).get("decode") or {}
                    check((b.get("tok_s") or 0) > 0 and (b.get("ratio") or 0) > 0 and
                          (dec.get("steps") or 0) > 0 and dec.get("bound_s", 0) > 0,
                          "%d streams %s %s %s: a bound with decode steps"
                          % (x["streams"], x["policy"], mode, phase))
    return result.summary()


if __name__ == "__main__":
    sys.exit(main())
