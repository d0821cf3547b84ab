#!/usr/bin/env python3
"""Smoke test of `shoal synth` (synthetic containers for benchmarks).

Synthesizes a tiny container (a few MB), requires that `shoal inspect
--verify` accepts it, that the same options give the same bytes, that a
4-token run gives finite logits, and that routing is skewed the way the
trace says (the experts the trace makes hottest take well over their
uniform share; a --trace uniform container does not). Uses the OLMoE trace
in ../shared/data/traces when present, else the built-in zipf trace.
Seconds long.

Usage: /usr/bin/python3 tests/reference/test_synth.py --shoal BIN
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TRACE = os.path.join(ROOT, "..", "shared", "data", "traces", "allenai-OLMoE-routing",
                     "expert_counts.json")
# small but every real feature: GQA, per-head q/k norm, 32 experts top-4
SHAPE = ["--hidden", "128", "--moe-ff", "64", "--n-expert", "32", "--top-k", "4",
         "--layers", "2", "--vocab", "512", "--heads", "4", "--kv-heads", "2",
         "--head-dim", "32"]
passed = failed = 0


def result(name, ok, detail=""):
    global passed, failed
    passed += bool(ok)
    failed += not ok
    print("%s %s %s" % ("PASS" if ok else "FAIL", name, detail))


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def fingerprint(d):
    return json.load(open(os.path.join(d, "shoal.json")))["fingerprint"]


def check(shoal, model, tmp):
    """shoal synth --check: routing summary as a dict, or None."""
    out = os.path.join(tmp, "check.json")
    r = run([shoal, "synth", "--check", model, "--prompt-len", "40", "--decode", "60",
             "--json", out])
    if r.returncode != 0:
        return None, (r.stderr or r.stdout).strip()
    return json.load(open(out)), r.stdout.strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    a = ap.parse_args()
    shoal = os.path.abspath(a.shoal)
    trace = ["--trace", "olmoe"] if os.path.exists(TRACE) else ["--trace", "zipf"]
    if trace[1] == "zipf":
        print("note: ../shared/data/traces is absent; using the built-in zipf trace")
    tmp = tempfile.mkdtemp(prefix="shoal-synth-")
    try:
        m1 = os.path.join(tmp, "tiny")
        r = run([shoal, "synth", m1, "--gb", "0.004", "--seed", "3"] + SHAPE + trace)
        ok = r.returncode == 0 and os.path.exists(os.path.join(m1, "shoal.json"))
        result("synth writes a container", ok, "" if ok else r.stderr.strip()[-300:])
        if r.returncode != 0:
            return
        size = sum(os.path.getsize(os.path.join(m1, f)) for f in os.listdir(m1))
        result("container is a few MB", 1e6 <= size <= 8e6, "%d bytes" % size)
        result("no temporary directory left", not [f for f in os.listdir(tmp) if ".tmp-" in f])

        r = run([shoal, "inspect", m1, "--verify"])
        ok = r.returncode == 0 and "verify       ok" in r.stdout
        result("inspect --verify accepts it", ok, "" if ok else (r.stderr or r.stdout).strip()[-300:])

        m2 = os.path.join(tmp, "tiny2")
        r = run([shoal, "synth", m2, "--gb", "0.004", "--seed", "3"] + SHAPE + trace)
        same = r.returncode == 0 and fingerprint(m1) == fingerprint(m2)
        if same:
            for f in ("dense.bin", "experts.bin"):
                same = same and open(os.path.join(m1, f), "rb").read() == \
                    open(os.path.join(m2, f), "rb").read()
        result("same options give the same bytes", same)
        shutil.rmtree(m2, ignore_errors=True)
        r = run([shoal, "synth", m2, "--gb", "0.004", "--seed", "4"] + SHAPE + trace)
        result("another seed gives other bytes", r.returncode == 0 and
               fingerprint(m1) != fingerprint(m2))
        shutil.rmtree(m2, ignore_errors=True)

        r = run([shoal, "synth", m1, "--gb", "0.004"] + SHAPE)
        result("an existing DST is refused without --force",
               r.returncode == 1 and r.stderr.count("\n") == 1 and "--force" in r.stderr,
               r.stderr.strip())
        r = run([shoal, "synth", os.path.join(tmp, "x"), "--gb", "1", "--family", "llama"])
        result("an unknown family is a usage error", r.returncode == 2 and
               "qwen3_moe" in r.stderr and not os.path.exists(os.path.join(tmp, "x")),
               r.stderr.strip())

        npy = os.path.join(tmp, "logits.npy")
        r = run([shoal, "run", "--model", m1, "--tokens", "1,2,3,4", "--max-tokens", "4",
                 "--ignore-eos", "--logits-out", npy])
        ok = r.returncode == 0
        if ok:
            try:
                import numpy as np
                lg = np.load(npy)
                ok = lg.shape == (4, 512) and bool(np.isfinite(lg).all()) and \
                    float(np.abs(lg).max()) > 0.1
                detail = "shape %s, max |logit| %.3g" % (lg.shape, float(np.abs(lg).max()))
            except ImportError:
                detail = "numpy absent: exit status only"
        else:
            detail = r.stderr.strip()
        result("run 4 tokens: finite logits", ok, detail)

        j, out = check(shoal, m1, tmp)
        ok = j is not None and j["nonfinite_logits"] == 0 and "routing" in j
        result("synth --check decodes and measures routing", ok, out if not ok else "")
        if ok:
            rt = j["routing"]
            # experts the trace makes hottest (top 1/8 by target) vs their
            # uniform share of 1/8 of the (token, slot) pairs
            result("routing is skewed like the trace",
                   rt["top_eighth_achieved"] >= 0.17 and
                   abs(rt["top_eighth_achieved"] - rt["top_eighth_target"]) < 0.08,
                   "hottest 1/8 of experts take %.1f%% of slots (target %.1f%%, uniform 12.5%%)"
                   % (100 * rt["top_eighth_achieved"], 100 * rt["top_eighth_target"]))
            result("routing varies between tokens", j["distinct_ids"] >= 20 and
                   rt["top1_achieved"] < 0.5, "largest expert share %.1f%%" %
                   (100 * rt["top1_achieved"]))

        mu = os.path.join(tmp, "uniform")
        r = run([shoal, "synth", mu, "--gb", "0.004", "--seed", "3", "--trace", "uniform"] + SHAPE)
        j, out = check(shoal, mu, tmp) if r.returncode == 0 else (None, r.stderr)
        ok = j is not None and "routing" in j and j["routing"]["top_eighth_achieved"] < 0.17
        result("control: a uniform trace is not skewed", ok,
               "hottest 1/8 take %.1f%%" % (100 * j["routing"]["top_eighth_achieved"]) if ok else out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # a crash is a failure, reported like the others
        result("test harness", False, repr(e))
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)
