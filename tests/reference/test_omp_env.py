#!/usr/bin/python3
"""shoal's own OpenMP wait policy (common/base/omp_env.h, issue 12 item 9).

With none of OMP_WAIT_POLICY, GOMP_SPINCOUNT, KMP_BLOCKTIME set, `shoal`
and `shoal-worker` must run with a short bounded spin: libgomp (gcc builds)
GOMP_SPINCOUNT=1000, libomp (clang builds) KMP_BLOCKTIME=0, instead of the
runtimes' defaults (300000 polls, 200 ms) that collapse decode on a busy
machine. Any of the three set by the user must win. The effective values
are read from the runtime itself (OMP_DISPLAY_ENV=verbose, printed by
both runtimes when they start; with libgomp once per image, so the last
block is the one the process runs with). The re-executed process must keep
its arguments (the same text as with the policy set by hand) and its pid
(SIGTERM to the pid we started stops the worker with status 0).
Asserts configuration and behaviour, never speed.

usage: test_omp_env.py --shoal BUILD/coordinator/shoal [--worker BUILD/worker/shoal-worker]
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # tests/: harness
import harness as H  # noqa: E402
MODEL = os.path.join(os.path.dirname(os.path.dirname(HERE)), "models", "shakespeare-moe")
POLICY_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
result = H.Results()
check = result.check


def env_with(**kw):
    e = {k: v for k, v in os.environ.items() if k not in POLICY_KEYS}
    e["OMP_DISPLAY_ENV"] = "verbose"
    e.update(kw)
    return e


def effective(text):
    """(runtime, {name: value}) from the last OpenMP display block."""
    blocks = text.split("OPENMP DISPLAY ENVIRONMENT BEGIN")
    if len(blocks) < 2:
        return None, {}
    last = blocks[-1].split("OPENMP DISPLAY ENVIRONMENT END")[0]
    vals = dict(re.findall(r"\b(GOMP_SPINCOUNT|KMP_BLOCKTIME|OMP_WAIT_POLICY)\s*=\s*'([^']*)'",
                           last))
    return ("libomp" if "[host]" in last else "libgomp"), vals


def run(shoal, e):
    r = subprocess.run([shoal, "run", "--prompt", "ROMEO:", "--max-tokens", "8", "--greedy"],
                       capture_output=True, text=True, timeout=300, env=e)
    return r.returncode, r.stdout, r.stderr


def start_worker(worker, ct, e, log):
    with open(log, "w") as f:
        p = subprocess.Popen([worker, "--model", ct, "--listen", "127.0.0.1:0"],
                             stdout=f, stderr=subprocess.STDOUT, env=e)
    t0 = time.time()
    while time.time() - t0 < 120 and p.poll() is None:     # a watchdog, not a timing
        if "serving" in open(log, errors="replace").read():
            break
        time.sleep(0.05)
    return p


def expect_default(tag, rt, vals):
    if rt == "libgomp":
        check(vals.get("GOMP_SPINCOUNT") == "1000",
              "%s: libgomp spins 1000 times, not its 300000 (%s)" % (tag, vals))
    elif rt == "libomp":
        check(vals.get("KMP_BLOCKTIME") in ("0", "0ms", "0us"),
              "%s: libomp blocktime 0, not its 200 ms (%s)" % (tag, vals))
    else:
        check(False, "%s: no OpenMP display block in the output" % tag)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--worker")
    a = ap.parse_args()

    # shoal run: the default, then each override
    rc, out0, err = run(a.shoal, env_with())
    rt, vals = effective(err)
    check(rc == 0, "run, no policy set: exit 0" + ("" if rc == 0 else " (rc %d: %s)" % (
        rc, err.strip()[-300:])))
    print("     runtime: %s" % rt)
    expect_default("run, no policy set", rt, vals)
    rc, out1, err = run(a.shoal, env_with(OMP_WAIT_POLICY="passive"))
    check(rc == 0 and out1 == out0 and len(out0) > len("ROMEO:"),
          "run: same text with the default as with OMP_WAIT_POLICY=passive (argv kept "
          "across the re-execution): %r vs %r" % (out0[-60:], out1[-60:]))
    _, vals = effective(err)
    check(vals.get("OMP_WAIT_POLICY") == "PASSIVE" and
          vals.get("GOMP_SPINCOUNT", "0") == "0",
          "run, OMP_WAIT_POLICY=passive: the user's policy, nothing added (%s)" % vals)
    if rt == "libgomp":
        _, vals = effective(run(a.shoal, env_with(GOMP_SPINCOUNT="77"))[2])
        check(vals.get("GOMP_SPINCOUNT") == "77", "run, GOMP_SPINCOUNT=77 kept (%s)" % vals)
        _, vals = effective(run(a.shoal, env_with(KMP_BLOCKTIME="7"))[2])
        check(vals.get("GOMP_SPINCOUNT") == "300000",
              "run, KMP_BLOCKTIME set: shoal sets nothing, libgomp's own 300000 (%s)" % vals)
    elif rt == "libomp":
        _, vals = effective(run(a.shoal, env_with(KMP_BLOCKTIME="7"))[2])
        check(vals.get("KMP_BLOCKTIME") in ("7", "7ms"), "run, KMP_BLOCKTIME=7 kept (%s)" % vals)
        _, vals = effective(run(a.shoal, env_with(GOMP_SPINCOUNT="77"))[2])
        check(vals.get("KMP_BLOCKTIME") in ("200", "200ms"),
              "run, GOMP_SPINCOUNT set: shoal sets nothing, libomp's own 200 ms (%s)" % vals)

    if a.worker:
        tmp = tempfile.mkdtemp(prefix="shoal-omp-")
        try:
            ct = os.path.join(tmp, "ct")
            r = subprocess.run([a.shoal, "convert", MODEL, ct], capture_output=True, text=True,
                               timeout=300)
            check(r.returncode == 0, "convert the bundled model (%s)" % r.stderr.strip()[-200:])
            for tag, e, want in (("worker, no policy set", env_with(), None),
                                 ("worker, GOMP_SPINCOUNT=77", env_with(GOMP_SPINCOUNT="77"),
                                  "77")):
                log = os.path.join(tmp, "worker.log")
                p = start_worker(a.worker, ct, e, log)
                text = open(log, errors="replace").read()
                check("serving" in text and p.poll() is None,
                      "%s: serving (%s)" % (tag, text.strip()[-200:]))
                p.send_signal(signal.SIGTERM)
                try:
                    rc = p.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    p.kill()
                    rc = p.wait()
                check(rc == 0, "%s: SIGTERM to the pid started stops it with status 0 "
                      "(same pid after the re-execution; rc %s)" % (tag, rc))
                wrt, vals = effective(open(log, errors="replace").read())
                if want is None:
                    expect_default(tag, wrt, vals)
                elif wrt == "libgomp":
                    check(vals.get("GOMP_SPINCOUNT") == want, "%s: kept (%s)" % (tag, vals))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return result.summary()


if __name__ == "__main__":
    sys.exit(main())
