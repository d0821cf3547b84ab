#!/usr/bin/python3
"""Decode speed of the bundled model under each OpenMP wait policy, on an
idle machine and beside a CPU hog (issue 12, item 9; docs/BENCHMARKS.md).

A thread that reaches an OpenMP barrier first either spins (burns its CPU
polling) or sleeps in the kernel until the last thread arrives. Spinning
wins on an idle machine (no wake-up latency); on a busy one a spinning
thread takes the CPU the thread it waits for needs, and decode collapses.
Each policy below runs `shoal run` (one process each, greedy, a fixed
prompt, --max-tokens N --ignore-eos) and reads the decode tok/s it prints.
Repetitions alternate: all policies idle, then all beside the hog, then
idle again, ..., each round in a rotated order, so drift and the other
users of the machine spread over every policy. The hog is --hogs busy
loops (default: 2 per core) at the same nice level.

The table gives, per policy and state, the median tok/s, and the median
over rounds of its ratio to the best policy of the same round and state
(robust to a machine whose other load drifts); no figure is a pass/fail.

Policies (OMP_WAIT_POLICY, GOMP_SPINCOUNT and KMP_BLOCKTIME are removed
from the environment first, then each adds its own):
  shoal         nothing: what shoal sets itself when the user sets none
  libgomp       GOMP_SPINCOUNT=300000: libgomp's own default (spin ~3 ms)
  passive       OMP_WAIT_POLICY=passive: sleep at once
  spinN         GOMP_SPINCOUNT=N (N spins, then sleep), e.g. spin10000
  libomp        KMP_BLOCKTIME=200: libomp's own default (clang builds, macOS)
  blocktimeN    KMP_BLOCKTIME=N (spin N ms, then sleep), e.g. blocktime0
  active        OMP_WAIT_POLICY=active (spin ~forever; slow beside a hog)
The GOMP_ policies change nothing but shoal's default on a libomp build,
the KMP_ ones on a libgomp build (`ldd shoal | grep omp` says which).

usage: omp_policy_bench.py --shoal BUILD/coordinator/shoal [--reps 5]
       [--max-tokens 250] [--hogs N] [--policies shoal,libgomp,passive,...]
       [--json OUT] [--timeout S] [--model DIR [--tokens 1,2,3]] [--threads N]
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import benchlib  # noqa: E402

POLICY_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
DEFAULT_POLICIES = "shoal,libgomp,passive,spin1000,spin10000,spin30000,spin100000"
DECODE_RE = re.compile(r"decode (\d+) tokens, ([0-9.]+) tok/s")


def policy_env(name):
    """The environment of one policy name; ValueError on an unknown one."""
    if name == "shoal":
        return {}
    if name == "libgomp":
        return {"GOMP_SPINCOUNT": "300000"}
    if name == "libomp":
        return {"KMP_BLOCKTIME": "200"}
    if name in ("passive", "active"):
        return {"OMP_WAIT_POLICY": name}
    m = re.fullmatch(r"spin(\d+)", name)
    if m:
        return {"GOMP_SPINCOUNT": m.group(1)}
    m = re.fullmatch(r"blocktime(\d+)", name)
    if m:
        return {"KMP_BLOCKTIME": m.group(1)}
    raise ValueError("unknown policy '%s'; expected shoal, libgomp, libomp, passive, active, "
                     "spinN or blocktimeN" % name)


class Hog:
    """n busy-loop processes while in a with block (killed on exit)."""

    def __init__(self, n):
        self.n, self.procs = n, []

    def __enter__(self):
        for _ in range(self.n):
            self.procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        time.sleep(0.5)  # let the scheduler see them
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()
        self.procs = []


def runnable():
    """Tasks runnable right now (the 4th field of /proc/loadavg), or None."""
    try:
        return int(open("/proc/loadavg").read().split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        return None


def run_once(a, env):
    """One shoal run; returns decode tok/s, or None (with the reason logged)."""
    cmd = [a.shoal, "run"] + (["--tokens", a.tokens] if a.tokens else ["--prompt", a.prompt]) + [
        "--max-tokens", str(a.max_tokens), "--ignore-eos", "--greedy", "--no-echo"]
    if a.model:
        cmd += ["--model", a.model]
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout, env=env)
    except subprocess.TimeoutExpired:
        benchlib.log("  timed out after %g s" % a.timeout)
        return None
    m = DECODE_RE.search(r.stderr)
    if r.returncode != 0 or not m:
        benchlib.log("  shoal failed (%d): %s" % (r.returncode, r.stderr.strip()[-300:]))
        return None
    return float(m.group(2))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shoal", required=True, help="the shoal binary")
    ap.add_argument("--model", help="model directory (default: shoal's bundled model)")
    ap.add_argument("--prompt", default="ROMEO:")
    ap.add_argument("--tokens", help="prompt token ids instead (a model without a tokenizer)")
    ap.add_argument("--max-tokens", type=int, default=250)
    ap.add_argument("--threads", type=int, help="--threads for shoal (default: its own)")
    ap.add_argument("--reps", type=int, default=5, help="rounds per state (default 5)")
    ap.add_argument("--hogs", type=int, default=2 * (os.cpu_count() or 1),
                    help="busy loops beside the hogged runs (default: 2 per core)")
    ap.add_argument("--policies", default=DEFAULT_POLICIES)
    ap.add_argument("--states", default="idle,hog", help="idle, hog or both (default idle,hog)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per run (default 120)")
    ap.add_argument("--json", help="write every figure here")
    a = ap.parse_args()
    names = [p for p in a.policies.split(",") if p]
    try:
        envs = {p: policy_env(p) for p in names}
    except ValueError as e:
        print("omp_policy_bench: --policies: %s" % e, file=sys.stderr)
        return 2
    states = [s for s in a.states.split(",") if s]
    if not names or not states or any(s not in ("idle", "hog") for s in states) or \
            a.reps < 1 or a.max_tokens < 1 or a.hogs < 0:
        print("omp_policy_bench: expected policies, --states from idle,hog, --reps >= 1, "
              "--max-tokens >= 1 and --hogs >= 0", file=sys.stderr)
        return 2
    if not os.access(a.shoal, os.X_OK):
        print("omp_policy_bench: --shoal '%s' is not an executable" % a.shoal, file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    base = {k: v for k, v in os.environ.items() if k not in POLICY_KEYS}
    info = benchlib.machine_info(HERE)
    benchlib.log("%s, %s cores, load %s; %d policies x %s x %d rounds" % (
        info.get("cpu"), info.get("cores"), benchlib.loadavg(), len(names), "/".join(states),
        a.reps))
    tps = {(p, s): [] for p in names for s in states}
    loads = {s: [] for s in states}
    for rep in range(a.reps):
        order = names[rep % len(names):] + names[:rep % len(names)]
        for s in states:
            with Hog(a.hogs if s == "hog" else 0):
                for p in order:
                    t = run_once(a, dict(base, **envs[p]))
                    benchlib.log("round %d %-5s %-12s %s tok/s" % (
                        rep + 1, s, p, "-" if t is None else "%.1f" % t))
                    tps[(p, s)].append(t)
                    loads[s].append(runnable())

    def median(xs):
        xs = [x for x in xs if x is not None]
        return benchlib.med(xs) if xs else None

    meds = {k: median(v) for k, v in tps.items()}
    # per round: each policy's tok/s over the best of that round and state
    rel = {k: [] for k in tps}
    for s in states:
        for rep in range(a.reps):
            top = max([tps[(p, s)][rep] or 0 for p in names])
            for p in names:
                rel[(p, s)].append(tps[(p, s)][rep] / top if top and tps[(p, s)][rep] else
                                   (0.0 if top else None))
    rels = {k: median(v) for k, v in rel.items()}
    head = "%-12s" % "policy" + "".join(" | %10s %7s %5s" % (s + " tok/s", "vs best", "runs")
                                        for s in states)
    print("%s, %s cores; decode tok/s, median of %d rounds (%d tokens, prompt %r)" % (
        info.get("cpu"), info.get("cores"), a.reps, a.max_tokens, a.tokens or a.prompt))
    print("hog: %d busy loops; tasks runnable after each run, median: %s" % (
        a.hogs, ", ".join("%s %s" % (s, median(loads[s])) for s in states)))
    print("vs best: median over rounds of tok/s / the round's best (a failed run counts 0)")
    print(head)
    for p in names:
        row = "%-12s" % p
        for s in states:
            m, r, runs = meds[(p, s)], rels[(p, s)], tps[(p, s)]
            row += " | %10s %7s %5s" % ("-" if m is None else "%.1f" % m,
                                         "-" if r is None else "%.2f" % r,
                                         "%d/%d" % (sum(x is not None for x in runs), len(runs)))
        print(row)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": info, "max_tokens": a.max_tokens, "prompt": a.prompt,
                       "hogs": a.hogs, "reps": a.reps, "runnable": loads,
                       "runs": [{"policy": p, "state": s, "env": envs[p], "tok_s": tps[(p, s)],
                                 "median": meds[(p, s)], "vs_best": rel[(p, s)],
                                 "vs_best_median": rels[(p, s)]}
                                for p in names for s in states]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
