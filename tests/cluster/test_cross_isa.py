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

GGUF files (issue 30: ggml-typed weights through ggml_dot.h's rows, the
NEON ones in common/kernels/isa/ggml_neon.c), written by
tests/cli/test_run_gguf.py's writer from the bundled checkpoint:
  q4_k-q6_k  Q4_K gate and up experts, Q8_0 down experts, every other
             matrix Q6_K (token_embd and the router included): the types of
             a Q4_K_M file
  k-mix, iq-mix  random valid expert blocks of Q5_K, Q2_K, Q3_K, IQ4_XS,
             IQ4_NL, MXFP4 and IQ2_XXS, IQ3_XXS, IQ1_S (a type per layer)
Each: the aarch64 worker serving the file to an x86 coordinator without
local experts, and (--arm-shoal) the aarch64 `shoal run` of the whole file
under qemu (every matrix through the NEON rows): the x86 run's logits
bytes and text.

Usage: /usr/bin/python3 tests/cluster/test_cross_isa.py --shoal BIN \\
           --arm-worker build-aarch64/worker/shoal-worker
           [--arm-shoal build-aarch64/coordinator/shoal] [--qemu qemu-aarch64-static]
           [--qemu-cpu max] [--cases containers,gguf]
Skips (exit 0, with the reason) when the aarch64 worker or qemu is missing.
"""
import argparse
import json
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

sys.path.insert(0, os.path.join(H.ROOT, "tests", "cli"))


result = H.Results()


def want_kernels(qemu_cpu):
    """The table run-time selection must pick for these qemu CPUs."""
    return {"max": "neon-i8mm", "cortex-a76": "neon-dotprod",
            "cortex-a57": "neon"}.get(qemu_cpu, r"neon(-dotprod|-i8mm)?")


def start_arm_worker(a, model, log, env, procs):
    """An aarch64 shoal-worker under qemu serving model; (process, address,
    its log so far) once it says "serving" or gives up (60 s)."""
    port = free_port()
    w = subprocess.Popen([a.qemu, "-cpu", a.qemu_cpu, "-L", "/usr/aarch64-linux-gnu",
                          a.arm_worker, "--model", model, "--listen", "127.0.0.1:%d" % port],
                         stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
    procs.append(w)
    t0 = time.time()
    while time.time() - t0 < 60 and "serving" not in open(log).read():
        if w.poll() is not None:
            break
        time.sleep(0.1)
    return w, "127.0.0.1:%d" % port, open(log).read()


def gguf_files(tmp):
    """[(label, path)] of the GGUF files of the module docstring."""
    import numpy as np
    import test_run_gguf as T
    with open(os.path.join(MODEL, "config.json")) as f:
        cfg = json.load(f)
    st = T.read_safetensors(os.path.join(MODEL, "model.safetensors"))
    tensors = T.gguf_tensors(st, cfg["num_hidden_layers"], cfg["num_experts"])
    kvs = T.metadata(cfg)
    files = []
    path = os.path.join(tmp, "q4_k-q6_k.gguf")
    T.write_gguf(path, kvs, [(n, x, "Q8_0" if "ffn_down_exps" in n else typ)
                             for n, x, typ in T.typed(tensors, matrix_type="Q6_K",
                                                      expert_type="Q4_K")])
    files.append(("q4_k-q6_k", path))
    rng = np.random.default_rng(301)
    for label, gate_up, down in T.MIXES:
        typed = []
        for n, x, t in T.typed(tensors, matrix_type="BF16"):
            if "_exps." in n:
                il = int(n.split(".")[1])
                t = down[il % 2] if "ffn_down_exps" in n else gate_up[il % len(gate_up)]
                raw, _ = T.random_blocks(t, x, rng)
                x = (x, raw)
            typed.append((n, x, t))
        path = os.path.join(tmp, label + ".gguf")
        T.write_gguf(path, kvs, typed)
        files.append(("%s (%s)" % (label, ", ".join(gate_up + down)), path))
    return files


def gguf_cases(a, tmp, env, procs):
    import test_run_gguf as T
    for label, path in gguf_files(tmp):
        name = os.path.basename(path)[:-5]

        def run(cmd, tag, extra):
            npy = os.path.join(tmp, "%s-%s.npy" % (name, tag))
            r = subprocess.run(cmd + ["run", path] + T.ARGS + extra + ["--logits-out", npy],
                               capture_output=True, env=env, timeout=1800)
            return r, (open(npy, "rb").read() if os.path.exists(npy) else b"")

        ref, ref_npy = run([a.shoal], "ref", [])
        if not result("GGUF %s: the x86 run" % label, ref.returncode == 0 and
                      len(ref_npy) > 1000, ref.stderr.decode(errors="replace")[-300:]):
            continue
        w, addr, text = start_arm_worker(a, path, os.path.join(tmp, "w-%s.log" % name), env,
                                         procs)
        want = want_kernels(a.qemu_cpu)
        result("GGUF %s: aarch64 worker serves with %s kernels" % (label, want),
               "serving" in text and re.search(r"\b%s kernels" % want, text) is not None,
               [l for l in text.splitlines() if "serving" in l][:1] or text[-300:])
        r, npy = run([a.shoal], "worker", ["--workers", addr, "--control", "off",
                                           "--local-experts", "off"])
        result("GGUF %s, experts on the aarch64 worker: logits bytes and text identical "
               "to x86 in-process" % label,
               r.returncode == 0 and npy == ref_npy and r.stdout == ref.stdout,
               r.stderr.decode(errors="replace")[-300:])
        w.terminate()
        w.wait(timeout=30)
        if a.arm_shoal:
            r, npy = run([a.qemu, "-cpu", a.qemu_cpu, "-L", "/usr/aarch64-linux-gnu",
                          a.arm_shoal], "arm", [])
            result("GGUF %s, the whole run on aarch64 (%s): logits bytes and text identical "
                   "to x86" % (label, a.qemu_cpu),
                   r.returncode == 0 and npy == ref_npy and r.stdout == ref.stdout,
                   r.stderr.decode(errors="replace")[-300:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--arm-worker", required=True)
    ap.add_argument("--arm-shoal", default="", help="the aarch64 shoal (GGUF whole runs)")
    ap.add_argument("--qemu", default=shutil.which("qemu-aarch64-static") or "")
    ap.add_argument("--qemu-cpu", default="max")
    ap.add_argument("--cases", default="containers,gguf")
    a = ap.parse_args()
    if not os.access(a.arm_worker, os.X_OK) or not a.qemu:
        print("SKIP cross-ISA cluster: needs %s and qemu-aarch64-static" % a.arm_worker)
        return 0
    if a.arm_shoal and not os.access(a.arm_shoal, os.X_OK):
        print("cross-ISA: no %s, the aarch64 whole runs are skipped" % a.arm_shoal)
        a.arm_shoal = ""
    cases = a.cases.split(",")
    # the aarch64 worker runs under qemu-user: without binfmt_misc it cannot
    # re-execute itself to apply shoal's wait policy (common/base/omp_env.h), so
    # it is given here; the x86 coordinator sets its own
    env = dict(os.environ, GOMP_SPINCOUNT="1000")
    tmp = tempfile.mkdtemp(prefix="shoal-xisa-")
    procs = []
    try:
        for dtype in ("int4", "int4a8", "int8", "bf16") if "containers" in cases else ():
            ct = os.path.join(tmp, dtype)
            subprocess.run([a.shoal, "convert", MODEL, ct, "--experts", dtype], check=True,
                           capture_output=True)
            w, addr, text = start_arm_worker(a, ct, os.path.join(tmp, "w-%s.log" % dtype), env,
                                             procs)
            want = want_kernels(a.qemu_cpu)
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
                r, npy = run(name.replace(" ", ""), ["--workers", addr,
                                                     "--control", "off"] + extra)
                ok = r.returncode == 0 and npy == ref_npy and len(npy) > 1000 and \
                    r.stdout == ref.stdout
                result("%s, %s: logits bytes and text identical to x86 in-process" %
                       (dtype, name), ok, r.stderr.decode(errors="replace")[-300:] if not ok
                       else "")
            w.terminate()
            w.wait(timeout=30)
        if "gguf" in cases:
            gguf_cases(a, tmp, env, procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return result.summary()


if __name__ == "__main__":
    sys.exit(main())
