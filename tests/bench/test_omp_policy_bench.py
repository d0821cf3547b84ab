#!/usr/bin/python3
"""Smoke test of bench/omp_policy_bench.py (so the benchmark does not rot).

One round of two policies, idle and beside one busy loop, 4 tokens each:
exit 0, a table with both policies, and a JSON in which every run has a
positive decode rate and ratios in (0, 1]; the hog processes are gone
afterwards. Bad arguments: exit 2 with one line naming the problem, before
anything runs. Asserts behaviour, never speed.

usage: test_omp_policy_bench.py --shoal BUILD/coordinator/shoal
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # tests/: harness
import harness as H  # noqa: E402
BENCH = os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench", "omp_policy_bench.py")
result = H.Results()
check = result.check


def hogs_running():
    """pids of busy loops like the bench's (cmdline match), to see that none is left."""
    pids = []
    for d in os.listdir("/proc"):
        try:
            cmd = open("/proc/%s/cmdline" % d, "rb").read().split(b"\0")
        except OSError:
            continue
        if len(cmd) >= 3 and cmd[1] == b"-c" and cmd[2] == b"while True: pass":
            pids.append(int(d))
    return set(pids)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    a = ap.parse_args()
    before = hogs_running()
    with tempfile.TemporaryDirectory(prefix="shoal-ompb-") as tmp:
        out = os.path.join(tmp, "r.json")
        r = subprocess.run([sys.executable, BENCH, "--shoal", a.shoal, "--reps", "1", "--hogs", "1",
                            "--max-tokens", "4", "--policies", "shoal,passive", "--json", out],
                           capture_output=True, text=True, timeout=600)
        check(r.returncode == 0, "exit 0 (rc %d: %s)" % (r.returncode, r.stderr.strip()[-300:]))
        rows = [l for l in r.stdout.splitlines() if l.startswith(("shoal ", "passive "))]
        check(len(rows) == 2, "a table row per policy: %s" % rows)
        if r.returncode == 0:
            res = json.load(open(out))
            runs = res.get("runs", [])
            check(sorted((x["policy"], x["state"]) for x in runs) ==
                  [("passive", "hog"), ("passive", "idle"), ("shoal", "hog"), ("shoal", "idle")],
                  "JSON: both policies, idle and hog")
            for x in runs:
                check(len(x["tok_s"]) == 1 and (x["tok_s"][0] or 0) > 0 and
                      0 < (x["vs_best_median"] or 0) <= 1,
                      "%s %s: %s tok/s, %s of the best" % (x["policy"], x["state"], x["tok_s"],
                                                           x["vs_best_median"]))
        check(not (hogs_running() - before), "no busy loop left behind")
    for args, word in ((["--policies", "spinx"], "spinx"), (["--reps", "0"], "--reps"),
                       (["--states", "busy"], "--states"), ([], "--shoal")):
        cmd = [sys.executable, BENCH] + (["--shoal", a.shoal] if word != "--shoal" else
                                         ["--shoal", "/nonexistent/shoal"]) + args
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        lines = [l for l in r.stderr.splitlines() if l.strip()]
        check(r.returncode == 2 and len(lines) == 1 and word in lines[0] and not r.stdout,
              "%s: exit 2, one line naming %s (rc %d: %s)" % (" ".join(args) or "bad --shoal",
                                                              word, r.returncode, lines))
    return result.summary()


if __name__ == "__main__":
    sys.exit(main())
