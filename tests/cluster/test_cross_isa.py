#!/usr/bin/env python3
"""Placement never changes results, across instruction sets (DESIGN
contracts 1 and 7): an aarch64 shoal-worker (NEON kernels, run under
qemu-user) serving an x86-64 coordinator (AVX2 or scalar kernels) gives
logits bytes and text identical to the coordinator alone. This is the
headline deployment's mix: Apple Silicon workers, any coordinator.

For the bundled model as int4, int4a8, int8 and bf16 containers, with the
worker holding everything (--local-experts off) and as one of two executors.
qemu runs the worker as --qemu-cpu (default max: DotProd and I8MM, so it
picks the neon-i8mm kernels; cortex-a76 gives neon-dotprod, cortex-a57 neon).

Usage: /usr/bin/python3 tests/cluster/test_cross_isa.py --shoal BIN \\
           --arm-worker build-aarch64/worker/shoal-worker [--qemu qemu-aarch64-static]
           [--qemu-cpu max]
Skips (exit 0, with the reason) when the aarch64 worker or qemu is missing.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clusterlib import MODEL, free_port  # noqa: E402
import harness as H  # noqa: E402  (tests/, on the path through clusterlib)


result = H.Results()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--arm-worker", required=True)
    ap.add_argument("--qemu", default=shutil.which("qemu-aarch64-static") or "")
    ap.add_argument("--qemu-cpu", default="max")
    a = ap.parse_args()
    if not os.access(a.arm_worker, os.X_OK) or not a.qemu:
        print("SKIP cross-ISA cluster: needs %s and qemu-aarch64-static" % a.arm_worker)
        return 0
    # the aarch64 worker runs under qemu-user: without binfmt_misc it cannot
    # re-execute itself to apply shoal's wait policy (common/base/omp_env.h), so
    # it is given here; the x86 coordinator sets its own
    env = dict(os.environ, GOMP_SPINCOUNT="1000")
    tmp = tempfile.mkdtemp(prefix="shoal-xisa-")
    procs = []
    try:
        for dtype in ("int4", "int4a8", "int8", "bf16"):
            ct = os.path.join(tmp, dtype)
            subprocess.run([a.shoal, "convert", MODEL, ct, "--experts", dtype], check=True,
                           capture_output=True)
            port = free_port()
            log = os.path.join(tmp, "w-%s.log" % dtype)
            w = subprocess.Popen([a.qemu, "-cpu", a.qemu_cpu, "-L", "/usr/aarch64-linux-gnu",
                                  a.arm_worker,
                                  "--model", ct, "--listen", "127.0.0.1:%d" % port],
                                 stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
            procs.append(w)
            t0 = time.time()
            while time.time() - t0 < 60 and "serving" not in open(log).read():
                if w.poll() is not None:
                    break
                time.sleep(0.1)
            text = open(log).read()
            # the table run-time selection must pick for these qemu CPUs
            want = {"max": "neon-i8mm", "cortex-a76": "neon-dotprod",
                    "cortex-a57": "neon"}.get(a.qemu_cpu, r"neon(-dotprod|-i8mm)?")
            result("%s: aarch64 worker serves with %s kernels" % (dtype, want),
                   "serving" in text and re.search(r"\b%s kernels" % want, text) is not None,
                   [l for l in text.splitlines() if "serving" in l][:1])
            gen = ["--model", ct, "--prompt", "JULIET:\nO Romeo", "--max-tokens", "24",
                   "--seed", "11"]

            def run(name, extra):
                npy = os.path.join(tmp, "%s-%s.npy" % (dtype, name))
                r = subprocess.run([a.shoal, "run"] + gen + extra + ["--logits-out", npy],
                                   capture_output=True, env=env, timeout=300)
                return r, (open(npy, "rb").read() if os.path.exists(npy) else b"")

            ref, ref_npy = run("ref", [])
            for name, extra in (("worker only", ["--local-experts", "off"]),
                                ("worker + local", [])):
                r, npy = run(name.replace(" ", ""), ["--workers", "127.0.0.1:%d" % port,
                                                     "--control", "off"] + extra)
                ok = r.returncode == 0 and npy == ref_npy and len(npy) > 1000 and \
                    r.stdout == ref.stdout
                result("%s, %s: logits bytes and text identical to x86 in-process" %
                       (dtype, name), ok, r.stderr.decode(errors="replace")[-300:] if not ok
                       else "")
            w.terminate()
            w.wait(timeout=30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return result.summary()


if __name__ == "__main__":
    sys.exit(main())
