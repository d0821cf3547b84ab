#!/usr/bin/python3
"""Broken checkpoints and bad requests must give a clear one-line error, never a crash.

usage: /usr/bin/python3 tests/reference/test_bad_input.py --shoal PATH/TO/shoal
           [--workdir DIR] [--timeout SECONDS] [--configs DIR]

Each case copies a tiny checkpoint from gen_tiny.py (qwen3_moe; mixtral for the
sharded case), breaks one thing, runs

    SHOAL run --model DIR --tokens 17,300,3 --max-tokens 2 --greedy \
              --logits-out OUT.npy --ids-out IDS.txt   [case-specific args]

(cases marked for it also run `SHOAL convert DIR OUT`, which must fail the same way)
and asserts: exit status > 0 and not a signal (negative / >= 128), finishes within
the timeout, stderr has exactly one non-empty line, that line contains the
expected context (file / tensor / field / model_type ...), and stderr shows no
"Sanitizer", "Segmentation", "core dumped", "Aborted" or "Traceback".
Ends with "N passed, M failed"; exit status 1 if anything failed.
"""

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gen_tiny  # noqa: E402

CRASH_MARKERS = ("Sanitizer", "Segmentation", "core dumped", "Aborted", "Traceback")
BASE_TOKENS = [17, 300, 3]


# ---------------------------------------------------------------- safetensors edit helpers

def st_read(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def st_write(path, header, data):
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def st_rebuild(path, edit):
    """edit(list of [name, info, bytes]) -> list; rewrites the file with fresh offsets."""
    header, data = st_read(path)
    meta = header.pop("__metadata__", None)
    items = [[k, dict(v), bytes(data[v["data_offsets"][0]:v["data_offsets"][1]])] for k, v in header.items()]
    items = edit(items)
    nh = {"__metadata__": meta} if meta is not None else {}
    off, blobs = 0, []
    for k, info, b in items:
        info["data_offsets"] = [off, off + len(b)]
        nh[k] = info
        off += len(b)
        blobs.append(b)
    st_write(path, nh, b"".join(blobs))


# ---------------------------------------------------------------- cases

ST = "model.safetensors"
TRUNC_WORDS = ("truncat", "short", "beyond", "exceed", "past", "end of file", "eof", "offset", "size")


def c_missing_tensor(d):
    name = "model.layers.1.mlp.experts.5.down_proj.weight"
    st_rebuild(os.path.join(d, ST), lambda it: [x for x in it if x[0] != name])
    return [name], []


def c_extra_tensor(d):
    name = "model.layers.0.mlp.experts.16.up_proj.weight"   # experts are 0..15

    def ed(it):
        src = next(x for x in it if x[0] == "model.layers.0.mlp.experts.15.up_proj.weight")
        return it + [[name, dict(src[1]), src[2]]]
    st_rebuild(os.path.join(d, ST), ed)
    return [name], []


def c_misshaped_tensor(d):
    name = "model.layers.0.self_attn.k_proj.weight"         # [32, 64] -> [64, 32]

    def ed(it):
        for x in it:
            if x[0] == name:
                x[1]["shape"] = list(reversed(x[1]["shape"]))
        return it
    st_rebuild(os.path.join(d, ST), ed)
    return [name], []


def c_bad_dtype(d):
    name = "model.norm.weight"

    def ed(it):
        for x in it:
            if x[0] == name:
                n = len(x[2]) // 4
                x[1]["dtype"] = "I64"
                x[2] = struct.pack(f"<{n}q", *range(n))
        return it
    st_rebuild(os.path.join(d, ST), ed)
    return [name, "I64"], []


def c_offsets_out_of_range(d):
    name = "model.layers.2.self_attn.o_proj.weight"
    p = os.path.join(d, ST)
    header, data = st_read(p)
    b, e = header[name]["data_offsets"]
    header[name]["data_offsets"] = [len(data) - 8, len(data) - 8 + (e - b)]
    st_write(p, header, data)
    return [name, TRUNC_WORDS], []


def c_header_len_beyond_file(d):
    p = os.path.join(d, ST)
    raw = bytearray(open(p, "rb").read())
    raw[:8] = struct.pack("<Q", len(raw) + 4096)
    open(p, "wb").write(raw)
    return [ST, "header"], []


def c_header_not_json(d):
    p = os.path.join(d, ST)
    raw = bytearray(open(p, "rb").read())
    (n,) = struct.unpack("<Q", raw[:8])
    raw[8:8 + 16] = b"\x00\xffnot json at all"[:16].ljust(16, b"#")
    open(p, "wb").write(raw)
    return [ST, "header"], []


def c_truncated(d):
    p = os.path.join(d, ST)
    sz = os.path.getsize(p)
    with open(p, "r+b") as f:
        f.truncate(int(sz * 0.6))
    return [ST, TRUNC_WORDS], []


def c_malformed_config(d):
    p = os.path.join(d, "config.json")
    txt = open(p).read()
    open(p, "w").write(txt[: len(txt) // 2])
    return ["config.json", ("json", "parse", "malformed", "syntax", "invalid", "unexpected end")], []


def c_bad_field_type(d):
    p = os.path.join(d, "config.json")
    cfg = json.load(open(p))
    cfg["num_attention_heads"] = "sixteen"
    json.dump(cfg, open(p, "w"), indent=2)
    return ["num_attention_heads"], []


def c_unknown_model_type(d):
    p = os.path.join(d, "config.json")
    cfg = json.load(open(p))
    cfg["model_type"] = "deepseek_v9000"
    json.dump(cfg, open(p, "w"), indent=2)
    return ["deepseek_v9000", "mixtral", "qwen2_moe", "qwen3_moe", "olmoe"], []


def c_prompt_exceeds_ctx(d):
    return [("ctx", "context"), "20", "8"], ["--ctx", "8", "--tokens", ",".join(str(i) for i in range(1, 21))]


def c_token_out_of_range(d):
    return ["99999"], ["--tokens", "17,99999,3"]


def c_missing_shard(d):
    fn = "model-00002-of-00002.safetensors"
    os.remove(os.path.join(d, fn))
    return [fn], []


# --- config dimensions and RoPE keys (issue 12 items 6, 8). These also run
# `shoal convert`, which must refuse the same checkpoint the same way.

# ---- FP8 checkpoints (gen_tiny qwen3_moe_fp8: F8_E4M3 weights + F32 block scales)

FP8_W = "model.layers.1.mlp.experts.3.up_proj.weight"       # [136, 200]: scales [2, 2]


def c_fp8_no_scale(d):
    st_rebuild(os.path.join(d, ST), lambda it: [x for x in it if x[0] != FP8_W + "_scale_inv"])
    return [FP8_W, FP8_W + "_scale_inv"], []


def c_fp8_scale_shape(d):
    def ed(it):
        for x in it:
            if x[0] == FP8_W + "_scale_inv":     # [2, 2] -> [4, 1]: same bytes, wrong tiling
                x[1]["shape"] = [4, 1]
        return it
    st_rebuild(os.path.join(d, ST), ed)
    return [FP8_W + "_scale_inv", "[2, 2]", "[4, 1]"], []


def c_fp8_scale_dtype(d):
    def ed(it):
        for x in it:
            if x[0] == FP8_W + "_scale_inv":     # 4 f32 -> 4 bf16 halves (8 bytes)
                x[1]["dtype"] = "BF16"
                x[1]["shape"] = [2, 4]
        return it
    st_rebuild(os.path.join(d, ST), ed)
    return [FP8_W + "_scale_inv", "BF16", "F32"], []


def c_fp8_nan_code(d):
    name = "model.layers.2.self_attn.o_proj.weight"            # [200, 128]

    def ed(it):
        for x in it:
            if x[0] == name:
                b = bytearray(x[2])
                b[5 * 128 + 7] = 0x7f                          # row 5, col 7
                x[2] = bytes(b)
        return it
    st_rebuild(os.path.join(d, ST), ed)
    return [name, "NaN", "row 5, col 7"], []


def c_fp8_nan_expert(d):
    """A NaN code in every routed expert of layer 1 (up_proj row 2, col 9):
    a Hugging Face directory checks an expert's codes when it first runs,
    convert as it reads them; either way one line names the tensor."""
    def ed(it):
        for x in it:
            if x[0].startswith("model.layers.1.mlp.experts.") and x[0].endswith("up_proj.weight"):
                b = bytearray(x[2])
                b[2 * 200 + 9] = 0xff                          # [136, 200]: row 2, col 9
                x[2] = bytes(b)
        return it
    st_rebuild(os.path.join(d, ST), ed)
    return ["model.layers.1.mlp.experts.", "up_proj.weight", "NaN", "row 2, col 9"], []


def c_mxfp4_nan_exponent(d):
    """gpt-oss as shipped: E8M0 255 (NaN) for every layer-1 expert's gate_up
    rows 2..3, block 1: run (at the expert's first use) and convert refuse it
    in one line naming the tensor and where."""
    name = "model.layers.1.mlp.experts.gate_up_proj_scales"      # [8, 64, 2]

    def ed(it):
        for x in it:
            if x[0] == name:
                b = bytearray(x[2])
                for e in range(8):
                    for r in (2, 3):
                        b[(e * 64 + r) * 2 + 1] = 255
                x[2] = bytes(b)
        return it
    st_rebuild(os.path.join(d, ST), ed)
    return ["gate_up_proj", "255", "block 1"], []


def c_quant_method(d):
    def ed(cfg):
        cfg["quantization_config"]["quant_method"] = "gptq"
    edit_config(d, ed)
    return ["quantization_config.quant_method", "gptq", "fp8"], []


def c_quant_block(d):
    def ed(cfg):
        cfg["quantization_config"]["weight_block_size"] = [64, 64]
    edit_config(d, ed)
    return ["weight_block_size", "[64, 64]", "[128, 128]"], []


def c_quant_fmt(d):
    def ed(cfg):
        cfg["quantization_config"]["fmt"] = "e5m2"
    edit_config(d, ed)
    return ["quantization_config.fmt", "e5m2", "e4m3"], []


def c_fp8_without_config(d):
    def ed(cfg):
        del cfg["quantization_config"]
    edit_config(d, ed)
    return ["F8_E4M3", "quantization_config"], []


# ---- the DeepSeek family (gen_tiny deepseek_v3: 16 experts in 4 groups, top 2 kept)

def c_topk_group_over_n_group(d):
    def ed(cfg):
        cfg["topk_group"] = 5
    edit_config(d, ed)
    return ["config.json", "topk_group 5", "n_group 4"], []


def c_n_group_not_dividing(d):
    def ed(cfg):
        cfg["n_group"] = 3
        cfg["topk_group"] = 2
    edit_config(d, ed)
    return ["config.json", "n_routed_experts 16", "n_group 3"], []


def c_missing_correction_bias(d):
    name = "model.layers.1.mlp.gate.e_score_correction_bias"
    st_rebuild(os.path.join(d, "model.safetensors"),
               lambda it: [(n, i, b) for n, i, b in it if n != name])
    return [name, "missing"], []


def edit_config(d, edit, regen_shards=0, shape=None):
    """edit(cfg dict) in place; with regen_shards, rewrite the weights to the
    shapes the edited config implies (a consistent checkpoint, as a user's
    would be), so only the config check can refuse it; shape(list) -> list
    gives each tensor's shape (a changed size gets fresh values)."""
    p = os.path.join(d, "config.json")
    cfg = json.load(open(p))
    edit(cfg)
    json.dump(cfg, open(p, "w"), indent=2)
    if regen_shards:
        w = gen_tiny.make_weights(cfg, 1)
        if shape:
            w = [(n, a if shape(list(a.shape)) == list(a.shape) else
                  np.full(shape(list(a.shape)), 0.5, dtype=np.float32)) for n, a in w]
        gen_tiny.write_checkpoint(d, w, regen_shards)


def c_head_dim_zero(d):
    def ed(cfg):   # 8 / 16 heads = 0
        cfg.pop("head_dim")
        cfg["hidden_size"] = 8
    # o_proj [8, 0] written as [8]: the shape the old engine expected for it; it
    # then loaded the checkpoint and read past a buffer in forward (ASan)
    edit_config(d, ed, regen_shards=1, shape=lambda sh: sh[:1] if sh[1:] == [0] else sh)
    return ["config.json", "head_dim 0", "hidden_size 8", "num_attention_heads 16", "even"], []


def c_head_dim_one(d):
    def ed(cfg):   # mixtral derives head_dim: 128 / 128 = 1, no RoPE pair
        cfg["num_attention_heads"] = 128
    edit_config(d, ed, regen_shards=2)
    return ["config.json", "head_dim 1", "hidden_size 128", "num_attention_heads 128"], []


def c_size_overflow(d):
    def ed(cfg):   # each field in range, 2 x vocab x hidden beyond any real model
        cfg["vocab_size"] = 2147483647
        cfg["hidden_size"] = 1048576
    edit_config(d, ed)
    return ["config.json", "more than the supported"], []


def c_rope_parameters_unsupported(d):
    def ed(cfg):   # v5 layout; before: ignored, ran as default RoPE
        cfg["rope_parameters"] = {"rope_type": "longrope", "rope_theta": cfg.pop("rope_theta"),
                                  "factor": 2.0, "short_factor": [1.0] * 4, "long_factor": [1.0] * 4}
    edit_config(d, ed)
    return ["config.json", "rope_parameters", "longrope"], []


def c_rope_theta_conflict(d):
    def ed(cfg):   # transformers 4 reads the top level, 5 the object
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    edit_config(d, ed)
    return ["config.json", "rope_theta", "rope_parameters"], []


def c_layer_types_conflict(d):
    def ed(cfg):   # no sliding_window, yet layer 1 claims a window
        cfg["layer_types"] = ["full_attention", "sliding_attention", "full_attention"]
    edit_config(d, ed)
    return ["config.json", "layer_types[1]", "sliding_attention"], []


# name -> (base checkpoint, mutate[, also run `shoal convert`])
CASES = [
    ("missing tensor", "qwen3_moe", c_missing_tensor),
    ("extra unexpected tensor", "qwen3_moe", c_extra_tensor),
    ("mis-shaped tensor", "qwen3_moe", c_misshaped_tensor),
    ("unsupported dtype I64", "qwen3_moe", c_bad_dtype),
    ("tensor data_offsets beyond data", "qwen3_moe", c_offsets_out_of_range),
    ("safetensors header length beyond file", "qwen3_moe", c_header_len_beyond_file),
    ("safetensors header not JSON", "qwen3_moe", c_header_not_json),
    ("file truncated mid-data", "qwen3_moe", c_truncated),
    ("malformed config.json", "qwen3_moe", c_malformed_config),
    ("config field of wrong type", "qwen3_moe", c_bad_field_type),
    ("unknown model_type", "qwen3_moe", c_unknown_model_type),
    ("prompt longer than --ctx", "qwen3_moe", c_prompt_exceeds_ctx),
    ("token id out of range", "qwen3_moe", c_token_out_of_range),
    ("shard listed in index missing", "mixtral", c_missing_shard),
    ("head_dim derived as 0 (hidden_size < num_attention_heads)", "qwen3_moe", c_head_dim_zero, True),
    ("head_dim derived as 1 (mixtral)", "mixtral", c_head_dim_one, True),
    ("sizes whose product overflows", "qwen3_moe", c_size_overflow, True),
    ("v5 rope_parameters of an unsupported type", "qwen3_moe", c_rope_parameters_unsupported, True),
    ("rope_theta differs between top level and rope_parameters", "qwen3_moe", c_rope_theta_conflict, True),
    ("layer_types disagrees with sliding_window", "qwen3_moe", c_layer_types_conflict, True),
    ("FP8 weight without its scale", "qwen3_moe_fp8", c_fp8_no_scale, True),
    ("FP8 scale of the wrong shape", "qwen3_moe_fp8", c_fp8_scale_shape, True),
    ("FP8 scale of the wrong dtype", "qwen3_moe_fp8", c_fp8_scale_dtype, True),
    ("FP8 NaN code in a weight", "qwen3_moe_fp8", c_fp8_nan_code, True),
    ("FP8 NaN code in routed experts", "qwen3_moe_fp8", c_fp8_nan_expert, True),
    ("MXFP4 NaN exponent in gpt-oss experts", "gpt_oss_mxfp4", c_mxfp4_nan_exponent, True),
    ("unknown quantization_config.quant_method", "qwen3_moe_fp8", c_quant_method, True),
    ("unsupported weight_block_size", "qwen3_moe_fp8", c_quant_block, True),
    ("unknown quantization_config.fmt", "qwen3_moe_fp8", c_quant_fmt, True),
    ("F8_E4M3 weights without quantization_config", "qwen3_moe_fp8", c_fp8_without_config, True),
    ("topk_group larger than n_group", "deepseek_v3", c_topk_group_over_n_group, True),
    ("n_group does not divide the experts", "deepseek_v3", c_n_group_not_dividing, True),
    ("noaux_tc router without its correction bias", "deepseek_v3", c_missing_correction_bias, True),
]


def run_case(shoal, d, extra, expect, out_dir, timeout):
    args = ["--model", d, "--tokens", ",".join(map(str, BASE_TOKENS)), "--max-tokens", "2", "--greedy",
            "--logits-out", os.path.join(out_dir, "bad.npy"), "--ids-out", os.path.join(out_dir, "bad.txt")]
    # case-specific args override (later occurrence of --tokens replaces the earlier one)
    i = 0
    while i < len(extra):
        if extra[i] in args:
            args[args.index(extra[i]) + 1] = extra[i + 1]
        else:
            args += extra[i:i + 2]
        i += 2
    return expect_clean_failure([shoal, "run"] + args, expect, timeout)


def expect_clean_failure(cmd, expect, timeout):
    """(ok, message): cmd exits > 0 without a signal or crash marker, in time,
    with exactly one non-empty stderr line that mentions every item of expect
    (a tuple: any one of its alternatives)."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, errors="replace")
    except subprocess.TimeoutExpired:
        return False, f"hung: no exit within {timeout}s"
    except OSError as e:
        return False, f"cannot execute {cmd[0]}: {e}"
    err = p.stderr or ""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    problems = []
    if p.returncode == 0:
        problems.append("exit status 0 (expected failure)")
    elif p.returncode < 0 or p.returncode >= 128:
        problems.append(f"killed by a signal / crash (exit status {p.returncode})")
    crash = [m for m in CRASH_MARKERS if m in err]
    if crash:
        problems.append(f"crash markers in stderr: {crash}")
    if len(lines) != 1:
        problems.append(f"stderr has {len(lines)} non-empty lines, expected exactly 1")
    for e in expect:
        alts = e if isinstance(e, tuple) else (e,)
        if not any(x.lower() in err.lower() for x in alts):
            problems.append(f"stderr does not mention {' or '.join(repr(x) for x in alts)}")
    shown = " | ".join(lines[:3]) + (" | ..." if len(lines) > 3 else "")
    if problems:
        return False, "; ".join(problems) + f"  [rc={p.returncode}] stderr: {shown!r}"
    return True, f"rc={p.returncode}: {shown}"


def main():
    ap = argparse.ArgumentParser(description="shoal bad-input handling")
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--workdir")
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--configs", default=gen_tiny.DEFAULT_CONFIGS)
    a = ap.parse_args()
    shoal = os.path.abspath(a.shoal) if os.path.sep in a.shoal else (shutil.which(a.shoal) or a.shoal)

    passed = failed = skipped = 0
    work = a.workdir or tempfile.mkdtemp(prefix="shoal-bad-")
    os.makedirs(work, exist_ok=True)
    try:
        bases = sorted({c[1] for c in CASES})
        man, _ = gen_tiny.generate(os.path.join(work, "base"), a.configs, bases, verbose=False)
        out_dir = os.path.join(work, "out")
        os.makedirs(out_dir, exist_ok=True)
        for i, (title, base, fn, *convert) in enumerate(CASES):
            info = man["models"].get(base, {})
            if "skipped" in info:
                print(f"SKIP: {title}: ../shared/data/configs not found ({info['skipped']})")
                skipped += 1
                continue
            if "failed" in info:
                print(f"FAIL {title}: base checkpoint {base} could not be generated")
                failed += 1
                continue
            d = os.path.join(work, f"case{i:02d}")
            shutil.rmtree(d, ignore_errors=True)
            shutil.copytree(os.path.join(work, "base", base), d)
            expect, extra = fn(d)
            ok, msg = run_case(shoal, d, extra, expect, out_dir, a.timeout)
            print(f"{'PASS' if ok else 'FAIL'} {title}: {msg}")
            passed += ok
            failed += not ok
            if convert and convert[0]:
                dst = os.path.join(out_dir, f"convert{i:02d}")
                ok, msg = expect_clean_failure([shoal, "convert", d, dst], expect, a.timeout)
                if ok and os.path.exists(os.path.join(dst, "shoal.json")):
                    ok, msg = False, f"convert refused but left a container in {dst}"
                print(f"{'PASS' if ok else 'FAIL'} {title} (convert): {msg}")
                passed += ok
                failed += not ok
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    if skipped:
        print(f"({skipped} skipped)")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
