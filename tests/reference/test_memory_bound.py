#!/usr/bin/env python3
"""Peak RSS during decode stays within
    dense trunk + --expert-cache + --pin + KV cache + a small fixed overhead
on a container whose routed experts are several times larger than the
memory the process may use (a cgroup v1 memory limit).

Builds a synthetic but real Qwen3-MoE checkpoint (random bf16 weights, 8
layers x 64 experts of 1.5 MiB = 768 MiB of experts, about 1.6 GB on disk
with the container), converts it, then decodes under a memory cgroup of
MEM_LIMIT bytes with a small cache and hot-set, reading every expert it
needs from disk. Peak RSS comes from wait4()'s ru_maxrss; the cgroup's
max_usage_in_bytes and failcnt are reported too. A second run with no
cache and no pin measures the fixed overhead (binary, libraries, scratch,
the store's staging blobs).

Needs root and the cgroup v1 memory controller (docs: ../shared/TESTING.md);
otherwise it prints SKIP and exits 0. Prints PASS/FAIL lines and the
measured numbers.

Usage: /usr/bin/python3 tests/reference/test_memory_bound.py --shoal BIN [--keep DIR]
"""
import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

MiB = 1 << 20
CGROUP_ROOT = "/sys/fs/cgroup/memory"
MEM_LIMIT = 192 * MiB           # the whole process, far below the 768 MiB of experts
CACHE, PIN = 32 * MiB, 32 * MiB
ALLOWED_OVERHEAD = 64 * MiB     # binary + libraries + scratch + staging, asserted
N_TOKENS = 24
PROMPT = "17,300,3,101,257,42,7"

CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "max_window_layers": 8,
    "hidden_act": "silu", "hidden_size": 512, "head_dim": 64, "num_attention_heads": 8,
    "num_key_value_heads": 2, "intermediate_size": 1024, "moe_intermediate_size": 512,
    "num_experts": 64, "num_experts_per_tok": 8, "norm_topk_prob": True,
    "num_hidden_layers": 8, "max_position_embeddings": 256, "vocab_size": 320,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_scaling": None,
    "sliding_window": None, "use_sliding_window": False, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def tensors(c):
    """[(hf name, shape, scale)] in file order."""
    H, V, D = c["hidden_size"], c["vocab_size"], c["head_dim"]
    nh, nkv, E, F = c["num_attention_heads"], c["num_key_value_heads"], c["num_experts"], \
        c["moe_intermediate_size"]
    t = [("model.embed_tokens.weight", [V, H], 1.0), ("model.norm.weight", [H], None),
         ("lm_head.weight", [V, H], 2.0 / np.sqrt(H))]
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        t += [(p + "input_layernorm.weight", [H], None),
              (p + "post_attention_layernorm.weight", [H], None),
              (p + "self_attn.q_proj.weight", [nh * D, H], 1 / np.sqrt(H)),
              (p + "self_attn.k_proj.weight", [nkv * D, H], 1 / np.sqrt(H)),
              (p + "self_attn.v_proj.weight", [nkv * D, H], 1 / np.sqrt(H)),
              (p + "self_attn.o_proj.weight", [H, nh * D], 1 / np.sqrt(nh * D)),
              (p + "self_attn.q_norm.weight", [D], None),
              (p + "self_attn.k_norm.weight", [D], None),
              (p + "mlp.gate.weight", [E, H], 2 / np.sqrt(H))]
        for e in range(E):
            q = p + "mlp.experts.%d." % e
            t += [(q + "gate_proj.weight", [F, H], 1 / np.sqrt(H)),
                  (q + "up_proj.weight", [F, H], 1 / np.sqrt(H)),
                  (q + "down_proj.weight", [H, F], 1 / np.sqrt(F))]
    return t


def write_checkpoint(d):
    """Stream a bf16 safetensors file tensor by tensor (bounded memory)."""
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=1)
    ts = tensors(CONFIG)
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, _ in ts:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    rng = np.random.default_rng(20240611)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for name, shape, scale in ts:
            if scale is None:   # norms
                a = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
            else:
                a = (scale * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
            f.write((a.view(np.uint32) >> 16).astype("<u2").tobytes())
    return off


def run_limited(cg, cmd):
    """Run cmd inside cgroup cg; return (rc, stderr, peak RSS bytes).

    Peak RSS is the child's ru_maxrss as GNU time reports it: the kernel keeps
    the largest RSS of a process across exec, so a child forked from this
    (large) Python process would report Python's RSS; time's own is ~2 MiB.
    Without /usr/bin/time, VmHWM is polled from /proc instead."""
    def enter():
        with open(os.path.join(cg, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    env = dict(os.environ, OMP_NUM_THREADS="2")
    gnu_time = os.path.exists("/usr/bin/time")
    argv = (["/usr/bin/time", "-f", "shoal-maxrss-kb=%M"] + cmd) if gnu_time else cmd
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         preexec_fn=enter, env=env)
    hwm = 0
    if not gnu_time:
        import threading

        def poll():
            nonlocal hwm
            while p.poll() is None:
                try:
                    with open("/proc/%d/status" % p.pid) as f:
                        m = re.search(r"VmHWM:\s+(\d+) kB", f.read())
                    if m:
                        hwm = max(hwm, int(m.group(1)) * 1024)
                except OSError:
                    break
                time.sleep(0.02)
        th = threading.Thread(target=poll)
        th.start()
    err = p.stderr.read().decode(errors="replace")
    rc = p.wait()
    if gnu_time:
        m = re.search(r"shoal-maxrss-kb=(\d+)", err)
        hwm = int(m.group(1)) * 1024 if m else -1
        err = re.sub(r"(Command exited with non-zero status \d+\n)?shoal-maxrss-kb=\d+\n?", "",
                     err)
    else:
        th.join()
    return rc, err, hwm


def cg_read(cg, name):
    try:
        with open(os.path.join(cg, name)) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError):
        return -1


def make_cgroup(limit):
    cg = os.path.join(CGROUP_ROOT, "shoal-memtest-%d" % os.getpid())
    os.mkdir(cg)
    with open(os.path.join(cg, "memory.limit_in_bytes"), "w") as f:
        f.write(str(limit))
    return cg


def drop_cgroup(cg):
    # the children have exited; charged page cache moves to the parent
    try:
        with open(os.path.join(cg, "memory.force_empty"), "w") as f:
            f.write("0")
    except OSError:
        pass
    os.rmdir(cg)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--keep", help="build/keep the checkpoint and container here")
    a = ap.parse_args()
    shoal = os.path.abspath(a.shoal)
    if os.geteuid() != 0:
        print("SKIP: needs root to create a memory cgroup")
        return 0
    if not os.path.isfile(os.path.join(CGROUP_ROOT, "memory.limit_in_bytes")):
        print("SKIP: no cgroup v1 memory controller at %s" % CGROUP_ROOT)
        return 0
    tmp = a.keep or tempfile.mkdtemp(prefix="shoal-membound-")
    failed = 0
    cg = None
    try:
        hf, ct = os.path.join(tmp, "hf"), os.path.join(tmp, "ct")
        if not os.path.exists(os.path.join(ct, "shoal.json")):
            src_bytes = write_checkpoint(hf)
            r = subprocess.run([shoal, "convert", hf, ct, "--experts", "bf16", "--dense", "bf16",
                                "--force"], capture_output=True, text=True)
            if r.returncode:
                print("FAIL convert: " + r.stderr.strip())
                return 1
            print("wrote checkpoint: %.0f MiB of bf16 weights" % (src_bytes / MiB))
        with open(os.path.join(ct, "shoal.json")) as f:
            man = json.load(f)
        dense = os.path.getsize(os.path.join(ct, "dense.bin"))
        experts = man["experts"]["bytes"]
        blob = man["experts"]["blob_bytes"]
        c = CONFIG
        n_ctx = min(c["max_position_embeddings"], 4096)
        kv = 2 * c["num_hidden_layers"] * n_ctx * c["num_key_value_heads"] * c["head_dim"] * 4
        print("container: dense %.1f MiB, experts %.1f MiB (%d x %.2f MiB), KV cache %.1f MiB, "
              "memory limit %.0f MiB (experts are %.1fx the limit)"
              % (dense / MiB, experts / MiB, experts // blob, blob / MiB, kv / MiB,
                 MEM_LIMIT / MiB, experts / MEM_LIMIT))
        base = [shoal, "run", "--model", ct, "--tokens", PROMPT, "--max-tokens", str(N_TOKENS),
                "--greedy", "--ignore-eos", "--stats"]
        runs = [("no cache, no pin, direct, uring", 0, 0, ["--direct", "on", "--io", "uring"]),
                ("cache 32M + pin 32M, direct, uring", CACHE, PIN,
                 ["--direct", "on", "--io", "uring"]),
                ("cache 32M + pin 32M, buffered, pread", CACHE, PIN,
                 ["--direct", "off", "--io", "pread"])]
        overhead0 = None
        for name, cache, pin, extra in runs:
            cg = make_cgroup(MEM_LIMIT)
            rc, err, rss = run_limited(cg, base + ["--expert-cache", str(cache), "--pin", str(pin)]
                                       + extra)
            usage, fails = cg_read(cg, "memory.max_usage_in_bytes"), cg_read(cg, "memory.failcnt")
            drop_cgroup(cg)
            cg = None
            m = re.search(r"([0-9.]+) MB read at ([0-9.]+) MB/s", err)
            read_mb = float(m.group(1)) if m else -1
            stall = re.search(r"stalled ([0-9.]+) ms/token", err)
            tok = re.search(r"decode \d+ tokens, ([0-9.]+) tok/s", err)
            bound = dense + cache + pin + kv
            over = rss - bound
            if overhead0 is None and rc == 0:
                overhead0 = over
            ok = rc == 0 and rss <= bound + ALLOWED_OVERHEAD and read_mb * 1e6 > MEM_LIMIT
            failed += not ok
            print("%s %s: peak RSS %.1f MiB = dense+cache+pin+KV %.1f MiB + overhead %.1f MiB "
                  "(allowed %.0f); cgroup max usage %.1f MiB, failcnt %d; read %.0f MB from disk, "
                  "%s ms/token stalled, %s tok/s%s"
                  % ("PASS" if ok else "FAIL", name, rss / MiB, bound / MiB, over / MiB,
                     ALLOWED_OVERHEAD / MiB, usage / MiB, fails, read_mb,
                     stall.group(1) if stall else "?", tok.group(1) if tok else "?",
                     "" if rc == 0 else " rc=%d: %s" % (rc, err.strip()[-600:])))
            if rc == 0 and not ok:
                print(err)
        if overhead0 is not None:
            print("measured fixed overhead (no cache, no pin): %.1f MiB, of which the store's "
                  "staging is at most 16 x %.2f MiB" % (overhead0 / MiB, blob / MiB))
    finally:
        if cg:
            try:
                drop_cgroup(cg)
            except OSError:
                pass
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print("%d failed" % failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
