#!/usr/bin/python3
"""`shoal inspect FILE.gguf` (issue 30) on GGUF files this test writes.

usage: /usr/bin/python3 tests/cli/test_inspect_gguf.py --shoal build-test/coordinator/shoal

Cases:
  table:  a qwen3moe-like file (token_embd F32, attention Q8_0, router F32,
          experts Q4_K/Q6_K/IQ2_XXS/MXFP4 as [n_expert][rows][cols], shared
          expert Q6_K, norms F32, output Q6_K): the architecture, the tensor
          count, each group with its types, the total bytes (and in KiB),
          one expert's bytes per layer, and which types run ("dequant
          reference only" for the others)
  json:   --json gives the same numbers (groups, bytes, per-expert bytes,
          native exactly for the types shoal run computes)
  split:  a set written as m-0000K-of-00002.gguf opens from either file
  bad:    truncated data, an unknown ggml type, a misaligned offset: exit 2
          (bad input, as shoal run and plan), one line naming the file and
          the tensor; a missing file of a split set: exit 1; --json on a container
          directory and --verify on a GGUF are usage errors (exit 2)
Ends with "N passed, M failed"; exit status 1 if anything failed.
"""

import argparse
import json
import os
import struct
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness as H  # noqa: E402

result = H.Results()

# ggml type: (id, block size, bytes per block)
TYPES = {"F32": (0, 1, 4), "Q8_0": (8, 32, 34), "Q4_K": (12, 256, 144),
         "Q6_K": (14, 256, 210), "IQ2_XXS": (16, 256, 66), "MXFP4": (39, 32, 17),
         "Q5_0": (6, 32, 22)}
N_EXPERT = 4
N_EMBD = 256
N_FF_EXP = 64


def nbytes(tname, dims):
    _, bs, ts = TYPES[tname]
    n = 1
    for d in dims:
        n *= d
    return n // bs * ts


def kv_str(k, v):
    k, v = k.encode(), v.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<IQ", 8, len(v)) + v


def kv_u32(k, v, t=4):
    k = k.encode()
    fmt = {4: "<I", 2: "<H", 5: "<i"}[t]
    return struct.pack("<Q", len(k)) + k + struct.pack("<I", t) + struct.pack(fmt, v)


def gguf(tensors, kvs, align=32, truncate=0, bad_offset=None):
    """tensors: [(name, type name or id, dims innermost first)]."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)))
    for kv in kvs:
        out += kv
    data = bytearray()
    for name, t, dims in tensors:
        tid = TYPES[t][0] if isinstance(t, str) else t
        nb = nbytes(t, dims) if isinstance(t, str) else 64
        off = len(data) if name != bad_offset else len(data) + 8
        out += struct.pack("<Q", len(name)) + name.encode() + struct.pack("<I", len(dims))
        out += struct.pack("<%dQ" % len(dims), *dims) + struct.pack("<IQ", tid, off)
        data += bytes((i * 7 + 3) & 0xFF for i in range(nb))
        data += b"\0" * (-len(data) % align)
    out += b"\0" * (-len(out) % align)
    blob = bytes(out + data)
    return blob[:len(blob) - truncate] if truncate else blob


def model_tensors():
    t = [("token_embd.weight", "F32", [N_EMBD, 32]),
         ("output_norm.weight", "F32", [N_EMBD]),
         ("output.weight", "Q6_K", [N_EMBD, 32])]
    exp_types = [("Q4_K", "Q4_K", "Q6_K"), ("IQ2_XXS", "IQ2_XXS", "MXFP4")]
    for il in range(2):
        b = "blk.%d." % il
        t += [(b + "attn_norm.weight", "F32", [N_EMBD]),
              (b + "attn_q.weight", "Q8_0", [N_EMBD, N_EMBD]),
              (b + "attn_k.weight", "Q8_0", [N_EMBD, 64]),
              (b + "attn_v.weight", "Q8_0", [N_EMBD, 64]),
              (b + "attn_output.weight", "Q8_0", [N_EMBD, N_EMBD]),
              (b + "ffn_norm.weight", "F32", [N_EMBD]),
              (b + "ffn_gate_inp.weight", "F32", [N_EMBD, N_EXPERT]),
              (b + "ffn_gate_exps.weight", exp_types[il][0], [N_EMBD, N_FF_EXP, N_EXPERT]),
              (b + "ffn_up_exps.weight", exp_types[il][1], [N_EMBD, N_FF_EXP, N_EXPERT]),
              (b + "ffn_down_exps.weight", exp_types[il][2], [N_FF_EXP * 4, N_EMBD // 4, N_EXPERT]),
              (b + "ffn_gate_shexp.weight", "Q6_K", [N_EMBD, N_FF_EXP]),
              (b + "ffn_up_shexp.weight", "Q6_K", [N_EMBD, N_FF_EXP]),
              (b + "ffn_down_shexp.weight", "Q6_K", [N_FF_EXP * 4, N_EMBD // 4])]
    return t


KVS = [kv_str("general.architecture", "qwen3moe"), kv_str("general.name", "tiny test"),
       kv_u32("qwen3moe.block_count", 2), kv_u32("qwen3moe.expert_count", N_EXPERT)]


def write(path, blob):
    with open(path, "wb") as f:
        f.write(blob)


def test_table_and_json(shoal, tmp):
    tensors = model_tensors()
    path = os.path.join(tmp, "tiny-Q4_K_M.gguf")
    write(path, gguf(tensors, KVS))
    total = sum(nbytes(t, d) for _, t, d in tensors)
    per_expert = [sum(nbytes(t, d) // N_EXPERT for n, t, d in tensors
                      if n.startswith("blk.%d." % il) and n.endswith("_exps.weight"))
                  for il in range(2)]
    r = H.run([shoal, "inspect", path])
    out = r.stdout
    result("inspect FILE.gguf exits 0", r.returncode == 0, r.stderr)
    result("prints the architecture and name", "qwen3moe" in out and "tiny test" in out, out)
    result("prints the tensor count and total bytes, in KiB too",
           "tensors      %d, %d bytes (%.2f KiB)" % (len(tensors), total, total / 1024) in out,
           out)
    lines = {l.split("  ")[0].strip(): l for l in out.splitlines()}
    exps = next((l for l in out.splitlines() if l.startswith("routed experts")), "")
    result("routed experts: 6 tensors of Q4_K, Q6_K, IQ2_XXS, MXFP4",
           " 6 " in exps and all(t in exps for t in ("Q4_K x2", "Q6_K x1", "IQ2_XXS x2",
                                                      "MXFP4 x1")), exps)
    for g, want in (("attention (attn_*)", "Q8_0 x8"), ("shared experts (ffn_*_shexp)", "Q6_K x6"),
                    ("router (ffn_gate_inp)", "F32 x2"), ("norms", "F32 x5"),
                    ("output", "Q6_K x1"), ("token_embd", "F32 x1")):
        line = lines.get(g, "")
        result("group %s: %s" % (g, want), want in line, line or out)
    for b in per_expert:
        result("one expert is %d bytes in 1 layer" % b, "  %d bytes" % b in out, out)
    # what `shoal run FILE.gguf` computes today: every type of this file
    RUNS = {"F32", "Q8_0", "Q4_K", "Q6_K", "IQ2_XXS", "MXFP4"}
    typelines = [l for l in out.splitlines() if l.split(" ")[0] in TYPES]
    result("each type says whether it runs: %s do, the others are 'dequant reference only'"
           % sorted(RUNS),
           typelines and all(("runs" in l) == (l.split(" ")[0] in RUNS) for l in typelines)
           and all("dequant reference only" in l for l in typelines
                   if l.split(" ")[0] not in RUNS), out)
    result("IQ2_XXS and MXFP4 experts (ggml_dot.h's integer form): shoal run takes the file",
           "shoal run takes this file" in out, out[-300:])

    r = H.run([shoal, "inspect", "--model", path, "--json"])
    ok = r.returncode == 0
    try:
        j = json.loads(r.stdout)
    except ValueError as e:
        ok, j = False, {"error": str(e)}
    result("--json parses", ok, r.stderr or r.stdout[:200])
    if not ok:
        return
    groups = {g["group"]: g for g in j.get("groups", [])}
    result("json: architecture, n_tensors, bytes",
           j.get("architecture") == "qwen3moe" and j.get("n_tensors") == len(tensors)
           and j.get("bytes") == total, j)
    exp_bytes = sum(nbytes(t, d) for n, t, d in tensors if n.endswith("_exps.weight"))
    result("json: routed_experts bytes and types",
           groups.get("routed_experts", {}).get("bytes") == exp_bytes
           and set(groups["routed_experts"]["types"]) == {"Q4_K", "Q6_K", "IQ2_XXS", "MXFP4"},
           groups.get("routed_experts"))
    per = sorted(p["bytes"] for p in j["experts"]["bytes_per_expert"])
    result("json: bytes per expert %s" % sorted(per_expert),
           per == sorted(per_expert) and j["experts"]["n_expert"] == N_EXPERT, j["experts"])
    result("json: native exactly for %s, each has a dequant reference" % sorted(RUNS),
           j["types"] and all(t["native"] == (t["type"] in RUNS) and t["dequant_reference"]
                              for t in j["types"]), j["types"])


def test_split(shoal, tmp):
    tensors = model_tensors()
    half = len(tensors) // 2
    parts = [tensors[:half], tensors[half:]]
    for i, part in enumerate(parts):
        kvs = KVS + [kv_u32("split.no", i, 2), kv_u32("split.count", 2, 2)]
        if i == 0:
            kvs.append(kv_u32("split.tensors.count", len(tensors), 5))
        write(os.path.join(tmp, "m-%05d-of-00002.gguf" % (i + 1)), gguf(part, kvs))
    for i in (1, 2):
        r = H.run([shoal, "inspect", os.path.join(tmp, "m-%05d-of-00002.gguf" % i), "--json"])
        try:
            j = json.loads(r.stdout)
        except ValueError:
            j = {}
        result("split set opens from file %d of 2" % i,
               r.returncode == 0 and len(j.get("files", [])) == 2
               and j.get("n_tensors") == len(tensors), r.stderr or r.stdout[:200])
    os.unlink(os.path.join(tmp, "m-00002-of-00002.gguf"))
    r = H.run([shoal, "inspect", os.path.join(tmp, "m-00001-of-00002.gguf")])
    result("a missing split file is named",
           r.returncode == 1 and "m-00002-of-00002.gguf" in r.stderr, r.stderr)


def test_bad(shoal, tmp):
    tensors = model_tensors()
    cases = [("truncated", gguf(tensors, KVS, truncate=100), "attn_q.weight"),
             ("unknown type", gguf([("blk.0.ffn_up_exps.weight", 77, [256, 4])], KVS), "77"),
             ("misaligned", gguf(tensors[:2], KVS, bad_offset="output_norm.weight"),
              "output_norm.weight")]
    cases[0] = ("truncated", cases[0][1], tensors[-1][0])
    for name, blob, needle in cases:
        path = os.path.join(tmp, "bad-%s.gguf" % name.replace(" ", "_"))
        write(path, blob)
        r = H.run([shoal, "inspect", path])
        lines = r.stderr.strip().splitlines()
        result("bad file (%s): exit 2, one line naming file and %s" % (name, needle),
               r.returncode == 2 and len(lines) == 1 and path in lines[0] and needle in lines[0],
               "exit %d: %r" % (r.returncode, r.stderr))
    r = H.run([shoal, "inspect", os.path.join(ROOT, "models", "shakespeare-moe"), "--json"])
    result("--json on a directory is a usage error", r.returncode == 2, r.stderr)
    path = os.path.join(tmp, "ok.gguf")
    write(path, gguf(tensors[:3], KVS))
    r = H.run([shoal, "inspect", path, "--verify"])
    result("--verify on a GGUF is a usage error", r.returncode == 2, r.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    a = ap.parse_args()
    shoal = os.path.abspath(a.shoal)
    with tempfile.TemporaryDirectory(prefix="shoal-gguf-") as tmp:
        test_table_and_json(shoal, tmp)
        test_split(shoal, tmp)
        test_bad(shoal, tmp)
    sys.exit(result.summary())


if __name__ == "__main__":
    main()
