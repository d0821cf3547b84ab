#!/usr/bin/python3
"""Independent numpy reference for the MoE families shoal supports.

Follows the Hugging Face transformers modeling files (mixtral, qwen2_moe,
qwen3_moe, olmoe, glm4_moe) and modeling_rope_utils.py, and for deepseek_v2,
deepseek_v3 and kimi_k2 the original modeling_deepseek.py shipped with the
checkpoints (MLA computed the decompressed way: k and v per head from
kv_b_proj, as that file does; the MoEGate; YaRN's mscale in the softmax
scale). Written from the semantics, not copied.

Compute precision: **float64** throughout (weights are upcast on load). The HF
models compute in the checkpoint dtype (f32 here) with an f32 softmax; an f32
engine should therefore agree to ~1e-6 relative, far inside the test tolerance.

Public API:
    load_model(model_dir) -> Model
    greedy(model_dir_or_Model, prompt_ids, n_steps) -> (ids, logits[n_steps][vocab])
    forward_logits(model, ids) -> logits [len(ids)][vocab]
    rope_params(cfg) -> (inv_freq, attention_scaling)

Errors about the checkpoint are raised as CheckpointError with a one-line
message naming the file / tensor / field.
"""

import json
import math
import os
import struct
import sys

import numpy as np

DEEPSEEK = ("deepseek_v2", "deepseek_v3", "kimi_k2")
SUPPORTED = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe") + DEEPSEEK + ("glm4_moe", "gpt_oss")


class CheckpointError(Exception):
    pass


# --------------------------------------------------------------------------
# safetensors reading (strict)
# --------------------------------------------------------------------------

_DT = {"F32": ("<f4", 4), "F16": ("<f2", 2), "F64": ("<f8", 8), "BF16": (None, 2),
       "F8_E4M3": (None, 1), "U8": ("<u1", 1)}

# OCP MX E2M1 values by nibble (sign bit 3), as gpt-oss's weights.py FP4_VALUES
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def dequant_mxfp4(tensors):
    """gpt-oss's MXFP4 experts: X_blocks [n, rows, cols/32, 16] (two E2M1 per
    byte, the low nibble first) and X_scales [n, rows, cols/32] (E8M0: value
    times 2^(s - 127)) become X [n, cols, rows], the input-major layout of the
    dequantized checkpoints (transformers' convert_moe_packed_tensors)."""
    for name in [n for n in tensors if n.endswith("_blocks")]:
        base = name[:-len("_blocks")]
        blk, sc = tensors.pop(name).astype(np.uint8), tensors.pop(base + "_scales")
        n, rows, nb, _ = blk.shape
        vals = np.empty((n, rows, nb, 32))
        vals[..., 0::2] = E2M1[blk & 15]
        vals[..., 1::2] = E2M1[blk >> 4]
        vals = vals * np.exp2(sc.astype(np.float64) - 127.0)[..., None]
        tensors[base] = vals.reshape(n, rows, nb * 32).transpose(0, 2, 1)
    return tensors


def e4m3_decode(codes):
    """OCP E4M3FN codes (uint8 array) -> float64 values, from the definition:
    sign bit 7, exponent bits 6..3 with bias 7, mantissa bits 2..0; exponent 0
    is subnormal (m / 8 * 2^-6); S.1111.111 is NaN; no infinities."""
    c = np.asarray(codes, dtype=np.int64)
    s = np.where(c & 0x80, -1.0, 1.0)
    e = (c >> 3) & 0xF
    m = (c & 7).astype(np.float64)
    v = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1.0 + m / 8.0) * np.exp2(e - 7.0))
    v = np.where((c & 0x7F) == 0x7F, np.nan, v)
    return s * v


def dequant_fp8(tensors, block=128):
    """Fold each F8_E4M3 weight's `<name>_scale_inv` (one f32 per block x block
    tile) into it: w = code * scale_inv[r // block][c // block], as DeepSeek-V3's
    inference/kernel.py weight_dequant does (it multiplies by the "inv" scale)."""
    for name in [n for n in tensors if n.endswith("_scale_inv")]:
        base = name[:-len("_scale_inv")]
        if base not in tensors:
            raise CheckpointError(f"scale tensor {name} has no weight {base}")
        w, s = tensors[base], tensors.pop(name)
        r, c = w.shape
        if s.shape != (-(-r // block), -(-c // block)):
            raise CheckpointError(f"{name}: shape {list(s.shape)} does not tile {base} {list(w.shape)}")
        tensors[base] = w * np.repeat(np.repeat(s, block, 0), block, 1)[:r, :c]
    return tensors


def read_safetensors(path):
    """Return {name: float64 ndarray}. Strict validation, one-line errors."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read: {e.strerror}")
    if len(raw) < 8:
        raise CheckpointError(f"{path}: file too short for a safetensors header ({len(raw)} bytes)")
    (hlen,) = struct.unpack("<Q", raw[:8])
    if hlen > len(raw) - 8:
        raise CheckpointError(
            f"{path}: safetensors header length {hlen} exceeds file size {len(raw)}")
    try:
        header = json.loads(raw[8:8 + hlen].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: malformed safetensors JSON header: {e}")
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: safetensors header is not a JSON object")
    data = memoryview(raw)[8 + hlen:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = info.get("dtype")
        shape = info.get("shape")
        offs = info.get("data_offsets")
        if dt not in _DT:
            raise CheckpointError(f"{path}: tensor {name}: unsupported dtype {dt}")
        if (not isinstance(shape, list) or not isinstance(offs, list) or len(offs) != 2):
            raise CheckpointError(f"{path}: tensor {name}: bad shape/data_offsets")
        npdt, size = _DT[dt]
        n = int(np.prod(shape)) if shape else 1
        b, e = offs
        if not (0 <= b <= e) or e > len(data):
            raise CheckpointError(
                f"{path}: tensor {name}: data_offsets [{b},{e}] beyond data section "
                f"({len(data)} bytes; file truncated?)")
        if e - b != n * size:
            raise CheckpointError(
                f"{path}: tensor {name}: {e - b} bytes for shape {shape} dtype {dt}")
        buf = data[b:e]
        if dt == "F8_E4M3":
            arr = e4m3_decode(np.frombuffer(buf, dtype=np.uint8)).astype(np.float32)
        elif dt == "BF16":
            u = np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16
            arr = u.view(np.float32)
        else:
            arr = np.frombuffer(buf, dtype=npdt)
        out[name] = arr.astype(np.float64).reshape(shape)
    return out


def load_tensors(model_dir):
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    single = os.path.join(model_dir, "model.safetensors")
    tensors = {}
    if os.path.exists(idx):
        try:
            with open(idx) as f:
                index = json.load(f)
            wm = index["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{idx}: malformed index: {e}")
        files = sorted(set(wm.values()))
        for fn in files:
            p = os.path.join(model_dir, fn)
            if not os.path.exists(p):
                raise CheckpointError(f"{p}: shard listed in model.safetensors.index.json is missing")
            part = read_safetensors(p)
            for k, v in part.items():
                if wm.get(k) != fn:
                    raise CheckpointError(f"{p}: tensor {k} not mapped to this file in index")
                tensors[k] = v
        for k, fn in wm.items():
            if k not in tensors:
                raise CheckpointError(f"{os.path.join(model_dir, fn)}: tensor {k} listed in index but absent")
    elif os.path.exists(single):
        tensors = read_safetensors(single)
    else:
        raise CheckpointError(f"{model_dir}: no model.safetensors or model.safetensors.index.json")
    return dequant_mxfp4(dequant_fp8(tensors))


# --------------------------------------------------------------------------
# config
# --------------------------------------------------------------------------

def load_config(model_dir):
    p = os.path.join(model_dir, "config.json")
    try:
        with open(p) as f:
            cfg = json.load(f)
    except OSError as e:
        raise CheckpointError(f"{p}: cannot read: {e.strerror}")
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{p}: malformed JSON: {e}")
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{p}: not a JSON object")
    mt = cfg.get("model_type")
    if mt not in SUPPORTED:
        raise CheckpointError(
            f"{p}: unsupported model_type {mt!r} (supported: {', '.join(SUPPORTED)})")
    c = normalize_config(cfg, p)
    check_dims(c, p)
    return c


# HF config-class defaults for keys that may be absent (only those we use).
_DEFAULTS = {
    "mixtral": dict(rms_norm_eps=1e-5, rope_theta=1e6, num_local_experts=8,
                    num_experts_per_tok=2, tie_word_embeddings=False, head_dim=None,
                    sliding_window=None),
    "qwen2_moe": dict(rms_norm_eps=1e-6, rope_theta=10000.0, norm_topk_prob=False,
                      decoder_sparse_step=1, mlp_only_layers=[], qkv_bias=True,
                      tie_word_embeddings=False, num_experts=60, num_experts_per_tok=4,
                      use_sliding_window=False),
    "qwen3_moe": dict(rms_norm_eps=1e-6, rope_theta=10000.0, norm_topk_prob=False,
                      decoder_sparse_step=1, mlp_only_layers=[], attention_bias=False,
                      tie_word_embeddings=False, num_experts=128, num_experts_per_tok=8,
                      use_sliding_window=False, head_dim=None),
    "olmoe": dict(rms_norm_eps=1e-5, rope_theta=10000.0, norm_topk_prob=False,
                  attention_bias=False, clip_qkv=None, tie_word_embeddings=False,
                  num_experts=64, num_experts_per_tok=8),
    # configuration_deepseek.py (V2 and V3) and Glm4MoeConfig defaults
    "deepseek_v2": dict(rms_norm_eps=1e-6, rope_theta=10000.0, norm_topk_prob=False,
                        n_shared_experts=0, first_k_dense_replace=0, moe_layer_freq=1,
                        topk_method="greedy", scoring_func="softmax", n_group=1, topk_group=1,
                        routed_scaling_factor=1.0, q_lora_rank=None, attention_bias=False,
                        tie_word_embeddings=False, num_nextn_predict_layers=0),
    "deepseek_v3": dict(rms_norm_eps=1e-6, rope_theta=10000.0, norm_topk_prob=True,
                        n_shared_experts=0, first_k_dense_replace=0, moe_layer_freq=1,
                        topk_method="noaux_tc", scoring_func="sigmoid", n_group=1, topk_group=1,
                        routed_scaling_factor=1.0, q_lora_rank=None, attention_bias=False,
                        tie_word_embeddings=False, num_nextn_predict_layers=0),
    "glm4_moe": dict(rms_norm_eps=1e-5, rope_theta=10000.0, norm_topk_prob=True,
                     n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
                     routed_scaling_factor=1.0, use_qk_norm=False, partial_rotary_factor=0.5,
                     attention_bias=False, tie_word_embeddings=False, head_dim=None,
                     num_nextn_predict_layers=0),
}
_DEFAULTS["kimi_k2"] = dict(_DEFAULTS["deepseek_v3"])
# GptOssConfig
_DEFAULTS["gpt_oss"] = dict(rms_norm_eps=1e-5, rope_theta=150000.0, attention_bias=True,
                            swiglu_limit=7.0, sliding_window=128, tie_word_embeddings=False,
                            head_dim=None)

_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
             "intermediate_size")
_INT_FIELDS = _REQUIRED + ("num_key_value_heads", "head_dim", "num_experts", "num_local_experts",
                           "num_experts_per_tok", "moe_intermediate_size",
                           "shared_expert_intermediate_size", "decoder_sparse_step",
                           "max_position_embeddings")


def _merge_rope_parameters(cfg, c, path):
    """transformers v5 keeps rope_theta, partial_rotary_factor and the scaling in
    one `rope_parameters` dict (v4: top-level rope_theta + `rope_scaling`). v5's
    RotaryEmbeddingConfigMixin takes `rope_scaling or rope_parameters` and fills
    rope_theta / partial_rotary_factor into it only where absent, so the dict's
    values win; v4 reads only the top level. Where the two readings would give
    different numbers, refuse. Writes the effective values into c."""
    rp, rs = cfg.get("rope_parameters"), cfg.get("rope_scaling")
    if rp is not None and rs is not None and rp != rs:
        raise CheckpointError(f"{path}: both rope_scaling and rope_parameters are given and they differ")
    d = rs if rs is not None else rp
    if d is None:
        return
    if not isinstance(d, dict):
        raise CheckpointError(f"{path}: rope_parameters / rope_scaling must be an object")
    for k, v in d.items():
        if isinstance(v, dict):
            raise CheckpointError(f"{path}: rope_parameters per layer type ({k!r}) is not supported")
    for k in ("rope_theta", "partial_rotary_factor"):
        if k in d:
            if k in cfg and cfg[k] is not None and float(cfg[k]) != float(d[k]):
                raise CheckpointError(f"{path}: {k} {cfg[k]} at the top level but {d[k]} in rope_parameters")
            c[k] = d[k]
    c["rope_scaling"] = d


def check_dims(c, path="config.json"):
    """Sizes the forward pass needs: RoPE rotates pairs of head_dim, and the
    families that derive head_dim from hidden_size need it to divide."""
    D, H, nh = c["head_dim"], c["hidden_size"], c["num_attention_heads"]
    if D < 2 or D % 2:
        raise CheckpointError(f"{path}: head_dim {D} (hidden_size {H}, num_attention_heads {nh}) "
                              f"must be even and >= 2")
    if c["model_type"] in ("qwen2_moe", "olmoe") and D * nh != H:
        raise CheckpointError(f"{path}: hidden_size {H} is not divisible by num_attention_heads {nh}")
    if rotary_dim(c) < 2:
        raise CheckpointError(f"{path}: rotary dimension of head_dim {D} is below 2")
    total = sum(math.prod(sh) for sh in expected_tensors(c).values())
    if total > 2 ** 46:
        raise CheckpointError(f"{path}: the sizes describe {total:.3g} weights, more than the supported 2^46")
    rt, _, key = _rope_scaling(c)
    if rt not in ROPE_TYPES:
        raise CheckpointError(f"{path}: unsupported {key} type {rt!r}")
    for i, t in enumerate(c.get("layer_types") or []):
        if t != "full_attention" and c["model_type"] != "gpt_oss":   # gpt_oss: windows
            raise CheckpointError(f"{path}: layer_types[{i}] {t!r}: only full_attention is implemented")


def normalize_config(cfg, path="config.json"):
    mt = cfg["model_type"]
    c = dict(_DEFAULTS[mt])
    c.update({k: v for k, v in cfg.items() if v is not None or k in ("clip_qkv", "rope_scaling", "head_dim")})
    for k in _REQUIRED:
        if k not in cfg:
            raise CheckpointError(f"{path}: missing required field {k}")
    for k in _INT_FIELDS:
        v = c.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise CheckpointError(f"{path}: field {k} must be a non-negative integer, got {v!r}")
    _merge_rope_parameters(cfg, c, path)
    for k in ("rms_norm_eps", "rope_theta"):
        v = c.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise CheckpointError(f"{path}: field {k} must be a positive number, got {v!r}")
    if c.get("decoder_sparse_step", 1) < 1:
        raise CheckpointError(f"{path}: field decoder_sparse_step must be >= 1")
    if mt in ("qwen2_moe", "qwen3_moe") and "moe_intermediate_size" not in cfg:
        raise CheckpointError(f"{path}: missing required field moe_intermediate_size")
    if mt == "qwen2_moe" and "shared_expert_intermediate_size" not in cfg:
        raise CheckpointError(f"{path}: missing required field shared_expert_intermediate_size")
    if c.get("num_key_value_heads") is None:
        c["num_key_value_heads"] = c["num_attention_heads"]
    if mt == "gpt_oss":
        c["n_experts"] = c["num_local_experts"]
        c["expert_ffn"] = c["intermediate_size"]
        c["top_k"] = c["num_experts_per_tok"]
        c["head_dim"] = int(c["head_dim"]) if c.get("head_dim") else \
            c["hidden_size"] // c["num_attention_heads"]
        L = c["num_hidden_layers"]
        c["layer_types"] = cfg.get("layer_types") or \
            ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(L)]
        return c
    if mt in DEEPSEEK or mt == "glm4_moe":
        for k in ("n_routed_experts", "moe_intermediate_size"):
            if not isinstance(cfg.get(k), int):
                raise CheckpointError(f"{path}: missing required field {k}")
        c["n_experts"] = c["n_routed_experts"]
        c["expert_ffn"] = c["moe_intermediate_size"]
        c["top_k"] = c["num_experts_per_tok"]
        if c["topk_group"] > c["n_group"]:
            raise CheckpointError(f"{path}: topk_group {c['topk_group']} > n_group {c['n_group']}")
        if mt == "glm4_moe":
            c["topk_method"], c["scoring_func"] = "noaux_tc", "sigmoid"
            c["head_dim"] = int(c["head_dim"]) if c.get("head_dim") else \
                c["hidden_size"] // c["num_attention_heads"]
        else:
            c["head_dim"] = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
        return c
    if mt == "mixtral":
        c["n_experts"] = c["num_local_experts"]
        c["expert_ffn"] = c["intermediate_size"]
    elif mt == "olmoe":
        c["n_experts"] = c["num_experts"]
        c["expert_ffn"] = c["intermediate_size"]
    else:
        c["n_experts"] = c["num_experts"]
        c["expert_ffn"] = c["moe_intermediate_size"]
    c["top_k"] = c["num_experts_per_tok"]
    if c["top_k"] > c["n_experts"]:
        raise CheckpointError(f"{path}: num_experts_per_tok {c['top_k']} > number of experts {c['n_experts']}")
    # head_dim: olmoe always hidden/heads; mixtral/qwen3 honour explicit head_dim;
    # qwen2_moe uses hidden/heads (its attention asserts head_dim*heads == hidden).
    if mt in ("mixtral", "qwen3_moe") and c.get("head_dim"):
        c["head_dim"] = int(c["head_dim"])
    else:
        c["head_dim"] = c["hidden_size"] // c["num_attention_heads"]
    if c["num_attention_heads"] % c["num_key_value_heads"]:
        raise CheckpointError(f"{path}: num_attention_heads not a multiple of num_key_value_heads")
    return c


def rotary_dim(c):
    if c["model_type"] in DEEPSEEK:
        return c["qk_rope_head_dim"]
    return int(c["head_dim"] * c.get("partial_rotary_factor", 1.0))


def is_moe_layer(c, i):
    mt = c["model_type"]
    if mt in ("mixtral", "olmoe", "gpt_oss"):
        return True
    if mt in DEEPSEEK:   # DeepseekV2DecoderLayer
        return i >= c["first_k_dense_replace"] and i % c["moe_layer_freq"] == 0
    if mt == "glm4_moe":
        return i >= c["first_k_dense_replace"]
    return (i not in (c.get("mlp_only_layers") or [])) and c["n_experts"] > 0 and \
        (i + 1) % c["decoder_sparse_step"] == 0


def expected_tensors(c, mtp=False):
    """{hf_name: shape} that a checkpoint of this config must contain (exactly).
    mtp: the MTP layers' tensors instead (num_nextn_predict_layers of them,
    layers num_hidden_layers..: enorm, hnorm, eh_proj, shared_head.norm and a
    decoder layer's tensors; DeepSeek-V3's names)."""
    mt = c["model_type"]
    H, V = c["hidden_size"], c["vocab_size"]
    nh, nkv, D = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    E, F = c["n_experts"], c["expert_ffn"]
    L = c["num_hidden_layers"]
    if mtp:
        t = {}
        layers = range(L, L + (c.get("num_nextn_predict_layers") or 0))
        for i in layers:
            p = f"model.layers.{i}."
            t.update({p + "enorm.weight": [H], p + "hnorm.weight": [H],
                      p + "eh_proj.weight": [H, 2 * H], p + "shared_head.norm.weight": [H]})
    else:
        t = {"model.embed_tokens.weight": [V, H], "model.norm.weight": [H]}
        if not c["tie_word_embeddings"]:
            t["lm_head.weight"] = [V, H]
        layers = range(L)
    for i in layers:
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = [H]
        t[p + "post_attention_layernorm.weight"] = [H]
        a = p + "self_attn."
        if mt in DEEPSEEK:
            ql, kvl, rope = c["q_lora_rank"], c["kv_lora_rank"], c["qk_rope_head_dim"]
            if ql:
                t[a + "q_a_proj.weight"] = [ql, H]
                t[a + "q_a_layernorm.weight"] = [ql]
                t[a + "q_b_proj.weight"] = [nh * D, ql]
            else:
                t[a + "q_proj.weight"] = [nh * D, H]
            t[a + "kv_a_proj_with_mqa.weight"] = [kvl + rope, H]
            t[a + "kv_a_layernorm.weight"] = [kvl]
            t[a + "kv_b_proj.weight"] = [nh * (c["qk_nope_head_dim"] + c["v_head_dim"]), kvl]
            t[a + "o_proj.weight"] = [H, nh * c["v_head_dim"]]
        else:
            t[a + "q_proj.weight"] = [nh * D, H]
            t[a + "k_proj.weight"] = [nkv * D, H]
            t[a + "v_proj.weight"] = [nkv * D, H]
            t[a + "o_proj.weight"] = [H, nh * D]
        if mt == "gpt_oss":
            if c["attention_bias"]:
                for x, n in (("q", nh), ("k", nkv), ("v", nkv)):
                    t[a + f"{x}_proj.bias"] = [n * D]
                t[a + "o_proj.bias"] = [H]
            t[a + "sinks"] = [nh]
            m = p + "mlp."
            t[m + "router.weight"] = [E, H]
            t[m + "router.bias"] = [E]
            t[m + "experts.gate_up_proj"] = [E, H, 2 * F]
            t[m + "experts.gate_up_proj_bias"] = [E, 2 * F]
            t[m + "experts.down_proj"] = [E, F, H]
            t[m + "experts.down_proj_bias"] = [E, H]
            continue
        if mt == "glm4_moe":
            if c["attention_bias"]:
                for x, n in (("q", nh), ("k", nkv), ("v", nkv)):
                    t[a + f"{x}_proj.bias"] = [n * D]
            if c["use_qk_norm"]:
                t[a + "q_norm.weight"] = [D]
                t[a + "k_norm.weight"] = [D]
        if mt == "qwen2_moe" and c["qkv_bias"]:
            for x, n in (("q", nh), ("k", nkv), ("v", nkv)):
                t[a + f"{x}_proj.bias"] = [n * D]
        if mt in ("qwen3_moe", "olmoe") and c["attention_bias"]:
            for x, n in (("q", nh), ("k", nkv), ("v", nkv)):
                t[a + f"{x}_proj.bias"] = [n * D]
            t[a + "o_proj.bias"] = [H]
        if mt == "qwen3_moe":
            t[a + "q_norm.weight"] = [D]
            t[a + "k_norm.weight"] = [D]
        if mt == "olmoe":
            t[a + "q_norm.weight"] = [nh * D]
            t[a + "k_norm.weight"] = [nkv * D]
        if mt == "mixtral":
            m = p + "block_sparse_moe."
            t[m + "gate.weight"] = [E, H]
            for e in range(E):
                t[m + f"experts.{e}.w1.weight"] = [F, H]
                t[m + f"experts.{e}.w2.weight"] = [H, F]
                t[m + f"experts.{e}.w3.weight"] = [F, H]
        elif is_moe_layer(c, i):
            m = p + "mlp."
            t[m + "gate.weight"] = [E, H]
            for e in range(E):
                t[m + f"experts.{e}.gate_proj.weight"] = [F, H]
                t[m + f"experts.{e}.up_proj.weight"] = [F, H]
                t[m + f"experts.{e}.down_proj.weight"] = [H, F]
            if mt in DEEPSEEK or mt == "glm4_moe":
                if c["topk_method"] == "noaux_tc":
                    t[m + "gate.e_score_correction_bias"] = [E]
                S = F * c["n_shared_experts"]
                if S:
                    for n in ("gate_proj", "up_proj"):
                        t[m + f"shared_experts.{n}.weight"] = [S, H]
                    t[m + "shared_experts.down_proj.weight"] = [H, S]
            if mt == "qwen2_moe":
                S = c["shared_expert_intermediate_size"]
                t[m + "shared_expert.gate_proj.weight"] = [S, H]
                t[m + "shared_expert.up_proj.weight"] = [S, H]
                t[m + "shared_expert.down_proj.weight"] = [H, S]
                t[m + "shared_expert_gate.weight"] = [1, H]
        else:
            m = p + "mlp."
            I = c["intermediate_size"]
            t[m + "gate_proj.weight"] = [I, H]
            t[m + "up_proj.weight"] = [I, H]
            t[m + "down_proj.weight"] = [H, I]
    return t


# --------------------------------------------------------------------------
# RoPE (modeling_rope_utils semantics)
# --------------------------------------------------------------------------

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")


def _rope_scaling(c):
    """(rope type, its parameters, the config key they came from)."""
    key = "rope_parameters" if c.get("rope_parameters") else "rope_scaling"
    rs = c.get("rope_scaling") or c.get("rope_parameters")
    if not rs:
        return "default", {}, key
    rt = rs.get("rope_type", rs.get("type", "default"))
    return rt, rs, key


def rope_params(c, seq_len=None):
    """Return (inv_freq [dim/2] float64, attention_scaling)."""
    base = float(c["rope_theta"])
    dim = rotary_dim(c)
    rt, rs, key = _rope_scaling(c)
    exps = np.arange(0, dim, 2, dtype=np.float64) / dim
    inv = 1.0 / base ** exps
    if rt == "default":
        return inv, 1.0
    if rt == "linear":
        return inv / float(rs["factor"]), 1.0
    if rt == "dynamic":
        # dynamic NTK: equals default until the sequence exceeds max_position_embeddings
        mpe = c["max_position_embeddings"]
        factor = float(rs["factor"])
        sl = mpe if seq_len is None else max(seq_len, mpe)
        b2 = base * ((factor * sl / mpe) - (factor - 1)) ** (dim / (dim - 2))
        return 1.0 / b2 ** exps, 1.0
    if rt == "yarn":
        factor = rs.get("factor")
        omp = rs.get("original_max_position_embeddings") or c["max_position_embeddings"]
        if factor is None:
            factor = c["max_position_embeddings"] / omp
        factor = float(factor)

        def get_mscale(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        af = rs.get("attention_factor")
        if af is None and c["model_type"] in DEEPSEEK:
            # DeepseekV2YarnRotaryEmbedding: mscale / mscale_all_dim default 1 / 0
            af = get_mscale(factor, rs.get("mscale", 1.0)) / get_mscale(factor, rs.get("mscale_all_dim", 0.0))
        if af is None:
            ms, msa = rs.get("mscale"), rs.get("mscale_all_dim")
            af = get_mscale(factor, ms) / get_mscale(factor, msa) if (ms and msa) else get_mscale(factor)
        beta_fast = rs.get("beta_fast") or 32
        beta_slow = rs.get("beta_slow") or 1
        truncate = rs.get("truncate", True)

        def corr_dim(nrot):
            return (dim * math.log(omp / (nrot * 2 * math.pi))) / (2 * math.log(base))

        low, high = corr_dim(beta_fast), corr_dim(beta_slow)
        if truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        extrap_f = 1.0 - ramp
        pos_freqs = base ** exps
        inv_ex = 1.0 / pos_freqs
        inv_in = 1.0 / (factor * pos_freqs)
        return inv_in * (1 - extrap_f) + inv_ex * extrap_f, float(af)
    if rt == "llama3":
        factor = float(rs["factor"])
        lf, hf = float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
        old = float(rs["original_max_position_embeddings"])
        low_wl, high_wl = old / lf, old / hf
        wl = 2 * math.pi / inv
        out = np.where(wl > low_wl, inv / factor, inv)
        smooth = (old / wl - lf) / (hf - lf)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = ~(wl < high_wl) & ~(wl > low_wl)
        return np.where(medium, smoothed, out), 1.0
    raise CheckpointError(f"config.json: unsupported {key} type {rt!r}")


def rope_cos_sin(c, T):
    inv, att = rope_params(c, seq_len=T)
    pos = np.arange(T, dtype=np.float64)
    fr = np.outer(pos, inv)
    emb = np.concatenate([fr, fr], axis=-1)
    return np.cos(emb) * att, np.sin(emb) * att


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def apply_rope(x, cos, sin, interleave=False):
    """RoPE on the first cos.shape[-1] dims of x [..., T, D] (partial rotary
    keeps the rest). interleave: DeepSeek's apply_rotary_pos_emb, which first
    permutes the rotary dims (d/2, 2) -> (2, d/2), i.e. evens then odds, and
    then rotates halves; q and k are permuted alike, so q.k is that of
    rotating the pairs (2i, 2i+1)."""
    r = cos.shape[-1]
    xr, rest = x[..., :r], x[..., r:]
    if interleave:
        xr = np.concatenate([xr[..., 0::2], xr[..., 1::2]], axis=-1)
    xr = xr * cos + rotate_half(xr) * sin
    return np.concatenate([xr, rest], axis=-1)


# --------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------

def rms(x, w, eps):
    var = np.mean(x * x, axis=-1, keepdims=True)
    return w * (x / np.sqrt(var + eps))


def silu(x):
    return x / (1.0 + np.exp(-x))


def softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


class Model:
    def __init__(self, cfg, W, model_dir=None):
        self.c = cfg
        self.W = W
        self.dir = model_dir


def load_model(model_dir, strict=True):
    cfg = load_config(model_dir)
    W = load_tensors(model_dir)
    exp = expected_tensors(cfg)
    for name, shape in exp.items():
        if name not in W:
            raise CheckpointError(f"{model_dir}: missing tensor {name} (expected shape {shape})")
        if list(W[name].shape) != list(shape):
            raise CheckpointError(
                f"{model_dir}: tensor {name} has shape {list(W[name].shape)}, expected {shape}")
    extra = sorted(set(W) - set(exp))
    L, nn = cfg["num_hidden_layers"], cfg.get("num_nextn_predict_layers") or 0
    mtp = tuple(f"model.layers.{j}." for j in range(L, L + nn))
    extra = [x for x in extra if not x.startswith(mtp)]   # MTP layers: loaded, never run
    if cfg["tie_word_embeddings"] and "lm_head.weight" in extra:
        extra.remove("lm_head.weight")  # HF ignores it when tied (ties to embeddings)
    if strict and extra:
        raise CheckpointError(f"{model_dir}: unexpected tensor {extra[0]}"
                              + (f" (+{len(extra) - 1} more)" if len(extra) > 1 else ""))
    return Model(cfg, W, model_dir)


def mla_attention(m, i, h, cos, sin):
    """DeepseekV2Attention.forward (modeling_deepseek.py), decompressed."""
    c, W = m.c, m.W
    T = h.shape[0]
    nh, D = c["num_attention_heads"], c["head_dim"]
    nope, rope, vd, kvl = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
    a = f"model.layers.{i}.self_attn."
    if c["q_lora_rank"]:
        qa = rms(h @ W[a + "q_a_proj.weight"].T, W[a + "q_a_layernorm.weight"], 1e-6)
        q = qa @ W[a + "q_b_proj.weight"].T
    else:
        q = h @ W[a + "q_proj.weight"].T
    q = q.reshape(T, nh, D).transpose(1, 0, 2)
    q_nope, q_pe = q[..., :nope], q[..., nope:]
    ckv = h @ W[a + "kv_a_proj_with_mqa.weight"].T
    latent, k_pe = ckv[:, :kvl], ckv[:, kvl:]
    kv = rms(latent, W[a + "kv_a_layernorm.weight"], 1e-6) @ W[a + "kv_b_proj.weight"].T
    kv = kv.reshape(T, nh, nope + vd).transpose(1, 0, 2)
    k_nope, v = kv[..., :nope], kv[..., nope:]
    q_pe = apply_rope(q_pe, cos, sin, interleave=True)
    k_pe = apply_rope(k_pe[None], cos, sin, interleave=True)
    qs = np.concatenate([q_nope, q_pe], axis=-1)
    ks = np.concatenate([k_nope, np.repeat(k_pe, nh, axis=0)], axis=-1)
    scale = D ** -0.5
    rt, rs, _ = _rope_scaling(c)
    if rt != "default" and rs.get("mscale_all_dim"):
        f = float(rs["factor"])
        ms = 0.1 * rs["mscale_all_dim"] * math.log(f) + 1.0 if f > 1 else 1.0
        scale = scale * ms * ms
    s = (qs @ ks.transpose(0, 2, 1)) * scale
    mask = np.triu(np.ones((T, T), dtype=bool), 1)
    p = softmax(np.where(mask[None], -np.inf, s), -1)
    o = (p @ v).transpose(1, 0, 2).reshape(T, nh * vd)
    return o @ W[a + "o_proj.weight"].T


def linear_bias(W, name, x):
    """x @ W[name.weight].T, plus W[name.bias] when the checkpoint has it."""
    y = x @ W[name + ".weight"].T
    b = W.get(name + ".bias")
    return y + b if b is not None else y


def gpt_oss_attention(m, i, h, cos, sin):
    """GptOssAttention + eager_attention_forward (modeling_gpt_oss.py): GQA with
    q/k/v/o biases, RoPE halves, the causal mask (a window of sliding_window
    keys, itself included, on the layers layer_types marks sliding), and one
    learned sink logit per head that joins the softmax and is dropped."""
    c, W = m.c, m.W
    T = h.shape[0]
    nh, nkv, D = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    a = f"model.layers.{i}.self_attn."

    def lin(x, n):
        return linear_bias(W, a + n, x)

    q = lin(h, "q_proj").reshape(T, nh, D).transpose(1, 0, 2)
    k = lin(h, "k_proj").reshape(T, nkv, D).transpose(1, 0, 2)
    v = lin(h, "v_proj").reshape(T, nkv, D).transpose(1, 0, 2)
    q, k = apply_rope(q, cos[None], sin[None]), apply_rope(k, cos[None], sin[None])
    k, v = np.repeat(k, nh // nkv, axis=0), np.repeat(v, nh // nkv, axis=0)
    s = (q @ k.transpose(0, 2, 1)) * D ** -0.5
    qi, kj = np.arange(T)[:, None], np.arange(T)[None, :]
    mask = kj > qi
    if c["layer_types"][i] == "sliding_attention":
        mask |= kj <= qi - c["sliding_window"]
    s = np.where(mask[None], -np.inf, s)
    sinks = np.broadcast_to(W[a + "sinks"][:, None, None], (nh, T, 1))
    p = softmax(np.concatenate([s, sinks], axis=-1), -1)[..., :-1]
    o = (p @ v).transpose(1, 0, 2).reshape(T, nh * D)
    return lin(o, "o_proj")


def gpt_oss_moe(m, i, h, trace):
    """GptOssTopKRouter + GptOssExperts: top-k of router(x) + bias, softmax over
    those k; each expert gate_up = x @ gate_up_proj[e] + bias (gate = even
    columns, up = odd), gate clamped above at swiglu_limit, up to +-limit,
    (up + 1) * gate * sigmoid(1.702 gate) @ down_proj[e] + bias."""
    c, W = m.c, m.W
    p = f"model.layers.{i}.mlp."
    k, lim = c["top_k"], c["swiglu_limit"]
    logits = h @ W[p + "router.weight"].T + W[p + "router.bias"]
    gu_w, gu_b = W[p + "experts.gate_up_proj"], W[p + "experts.gate_up_proj_bias"]
    d_w, d_b = W[p + "experts.down_proj"], W[p + "experts.down_proj_bias"]
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        order = np.argsort(-logits[t], kind="stable")
        sel = order[:k]
        w = softmax(logits[t, sel], -1)
        if trace is not None:
            sv = logits[t, order]
            trace.append((i, t, tuple(int(e) for e in sel), float(sv[k - 1] - sv[k])))
        for e, we in zip(sel, w):
            gu = h[t] @ gu_w[e] + gu_b[e]
            g, u = np.minimum(gu[0::2], lim), np.clip(gu[1::2], -lim, lim)
            glu = g / (1.0 + np.exp(-1.702 * g))
            out[t] += we * (((u + 1) * glu) @ d_w[e] + d_b[e])
    return out


def attention(m, i, h, cos, sin):
    c, W = m.c, m.W
    mt = c["model_type"]
    if mt in DEEPSEEK:
        return mla_attention(m, i, h, cos, sin)
    if mt == "gpt_oss":
        return gpt_oss_attention(m, i, h, cos, sin)
    T = h.shape[0]
    nh, nkv, D = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    a = f"model.layers.{i}.self_attn."

    def lin(x, n):
        return linear_bias(W, a + n, x)

    q, k, v = lin(h, "q_proj"), lin(h, "k_proj"), lin(h, "v_proj")
    eps = c["rms_norm_eps"]
    if mt == "olmoe":
        # q_norm/k_norm over the full projection width, before the head split
        q = rms(q, W[a + "q_norm.weight"], eps)
        k = rms(k, W[a + "k_norm.weight"], eps)
        cl = c.get("clip_qkv")
        if cl is not None:
            q, k, v = (np.clip(t, -cl, cl) for t in (q, k, v))
    q = q.reshape(T, nh, D).transpose(1, 0, 2)
    k = k.reshape(T, nkv, D).transpose(1, 0, 2)
    v = v.reshape(T, nkv, D).transpose(1, 0, 2)
    if mt == "qwen3_moe" or (mt == "glm4_moe" and c["use_qk_norm"]):
        # per-head RMSNorm over head_dim, before RoPE
        q = rms(q, W[a + "q_norm.weight"], eps)
        k = rms(k, W[a + "k_norm.weight"], eps)
    q = apply_rope(q, cos[None], sin[None])
    k = apply_rope(k, cos[None], sin[None])
    rep = nh // nkv
    k = np.repeat(k, rep, axis=0)  # head j uses kv head j // rep
    v = np.repeat(v, rep, axis=0)
    s = (q @ k.transpose(0, 2, 1)) / math.sqrt(D)
    mask = np.triu(np.ones((T, T), dtype=bool), 1)
    s = np.where(mask[None], -np.inf, s)
    p = softmax(s, -1)
    o = (p @ v).transpose(1, 0, 2).reshape(T, nh * D)
    y = o @ W[a + "o_proj.weight"].T
    b = W.get(a + "o_proj.bias")
    return y + b if b is not None else y


def swiglu(x, wg, wu, wd):
    return (silu(x @ wg.T) * (x @ wu.T)) @ wd.T


def moe(m, i, h, trace=None):
    c, W = m.c, m.W
    mt = c["model_type"]
    if mt == "mixtral":
        p = f"model.layers.{i}.block_sparse_moe."
        names = ("w1", "w3", "w2")  # gate, up, down
    else:
        p = f"model.layers.{i}.mlp."
        names = ("gate_proj", "up_proj", "down_proj")
    if not is_moe_layer(c, i):
        return swiglu(h, *(W[p + n + ".weight"] for n in names))
    if mt in DEEPSEEK or mt == "glm4_moe":
        return deepseek_moe(m, i, h, p, names, trace)
    if mt == "gpt_oss":
        return gpt_oss_moe(m, i, h, trace)
    k = c["top_k"]
    logits = h @ W[p + "gate.weight"].T
    probs = softmax(logits, -1)  # HF: softmax in float32 over all experts, then top-k
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        order = np.argsort(-probs[t], kind="stable")  # ties -> lower expert id first
        sel = order[:k]
        w = probs[t, sel]
        if mt == "mixtral" or c["norm_topk_prob"]:
            w = w / w.sum()
        if trace is not None:
            sp = probs[t, order]
            gap = sp[k - 1] - sp[k] if k < len(sp) else 1.0
            trace.append((i, t, tuple(int(e) for e in sel), float(gap)))
        for e, we in zip(sel, w):
            ex = p + f"experts.{e}."
            out[t] += we * swiglu(h[t:t + 1], *(W[ex + n + ".weight"] for n in names))[0]
    if mt == "qwen2_moe":
        se = p + "shared_expert."
        sh = swiglu(h, *(W[se + n + ".weight"] for n in names))
        g = 1.0 / (1.0 + np.exp(-(h @ W[p + "shared_expert_gate.weight"].T)))  # [T,1]
        out = out + g * sh
    return out


def deepseek_moe(m, i, h, p, names, trace):
    """MoEGate + DeepseekV2/V3MoE (modeling_deepseek.py), Glm4MoeTopkRouter:
    scores (softmax or sigmoid), choice = scores (+ e_score_correction_bias),
    groups ranked by max (group_limited_greedy) or the sum of the top 2
    (noaux_tc) with the others masked (-inf, DeepSeek's inference Gate),
    top-k of choice, weights = the unbiased scores, renormalised (+1e-20)
    when norm_topk_prob and k > 1, times routed_scaling_factor (V2: only the
    weights it does not renormalise); then the ungated shared experts."""
    c, W = m.c, m.W
    k, E, G, TG = c["top_k"], c["n_experts"], c["n_group"], c["topk_group"]
    logits = h @ W[p + "gate.weight"].T
    if c["scoring_func"] == "sigmoid":
        scores = 1.0 / (1.0 + np.exp(-logits))
    else:
        scores = softmax(logits, -1)
    choice = scores.copy()
    if c["topk_method"] == "noaux_tc":
        choice = choice + W[p + "gate.e_score_correction_bias"][None]
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        ch = choice[t].copy()
        ggap = 1.0
        if c["topk_method"] != "greedy" and G > 1:
            g = ch.reshape(G, -1)
            if c["topk_method"] == "noaux_tc":
                gs = np.sort(g, axis=1)[:, -2:].sum(1)
            else:
                gs = g.max(1)
            order_g = np.argsort(-gs, kind="stable")
            if TG < G:
                ggap = gs[order_g[TG - 1]] - gs[order_g[TG]]
            keep = np.zeros(G, dtype=bool)
            keep[order_g[:TG]] = True
            ch = np.where(np.repeat(keep, E // G), ch, -np.inf)
        order = np.argsort(-ch, kind="stable")
        sel = order[:k]
        w = scores[t, sel]
        norm = k > 1 and c["norm_topk_prob"]
        if norm:
            w = w / (w.sum() + 1e-20)
        if not (norm and c["model_type"] == "deepseek_v2"):
            w = w * c["routed_scaling_factor"]
        if trace is not None:
            sc = ch[order]
            gap = sc[k - 1] - sc[k] if k < len(sc) and np.isfinite(sc[k]) else 1.0
            trace.append((i, t, tuple(int(e) for e in sel), float(min(gap, ggap))))
        for e, we in zip(sel, w):
            ex = p + f"experts.{e}."
            out[t] += we * swiglu(h[t:t + 1], *(W[ex + n + ".weight"] for n in names))[0]
    if c["n_shared_experts"]:
        se = p + "shared_experts."
        out = out + swiglu(h, *(W[se + n + ".weight"] for n in names))
    return out


def forward_logits(m, ids, trace=None):
    c, W = m.c, m.W
    ids = list(ids)
    V = c["vocab_size"]
    for t in ids:
        if not (0 <= t < V):
            raise CheckpointError(f"token id {t} out of range (vocab_size {V})")
    x = W["model.embed_tokens.weight"][ids]
    cos, sin = rope_cos_sin(c, len(ids))
    eps = c["rms_norm_eps"]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = x + attention(m, i, rms(x, W[p + "input_layernorm.weight"], eps), cos, sin)
        x = x + moe(m, i, rms(x, W[p + "post_attention_layernorm.weight"], eps), trace)
    x = rms(x, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if c["tie_word_embeddings"] else W["lm_head.weight"]
    return x @ head.T


def final_hidden(m, ids):
    """The trunk's final normed hidden states [T][H] (what lm_head reads)."""
    c, W = m.c, m.W
    x = W["model.embed_tokens.weight"][list(ids)]
    cos, sin = rope_cos_sin(c, len(ids))
    eps = c["rms_norm_eps"]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = x + attention(m, i, rms(x, W[p + "input_layernorm.weight"], eps), cos, sin)
        x = x + moe(m, i, rms(x, W[p + "post_attention_layernorm.weight"], eps))
    return rms(x, W["model.norm.weight"], eps)


def mtp_logits(m, ids):
    """The first MTP layer's logits over a sequence: row j (0 <= j < T-1)
    predicts ids[j+2] from the trunk's final normed hidden state at j and
    the embedding of ids[j+1]. DeepSeek-V3 technical report §2.2, as
    vLLM's deepseek_mtp.py runs it (the embedding zeroed at position 0,
    [enorm(e) ; hnorm(h)] into eh_proj, a decoder layer over the MTP's own
    causal sequence, shared_head.norm, then shared_head.head or lm_head)."""
    c, W = m.c, m.W
    L, eps = c["num_hidden_layers"], c["rms_norm_eps"]
    p = f"model.layers.{L}."
    ids = list(ids)
    h = final_hidden(m, ids)[:-1]
    emb = W.get(p + "embed_tokens.weight", W["model.embed_tokens.weight"])[ids[1:]].copy()
    emb[0] = 0.0
    x = np.concatenate([rms(emb, W[p + "enorm.weight"], eps),
                        rms(h, W[p + "hnorm.weight"], eps)], axis=-1) @ W[p + "eh_proj.weight"].T
    cos, sin = rope_cos_sin(c, len(ids) - 1)
    x = x + attention(m, L, rms(x, W[p + "input_layernorm.weight"], eps), cos, sin)
    x = x + moe(m, L, rms(x, W[p + "post_attention_layernorm.weight"], eps))
    x = rms(x, W[p + "shared_head.norm.weight"], eps)
    head = W.get(p + "shared_head.head.weight")
    if head is None:
        head = W["model.embed_tokens.weight"] if c["tie_word_embeddings"] else W["lm_head.weight"]
    return x @ head.T


def greedy(model, prompt_ids, n_steps, trace=None):
    """Greedy decode by full recompute. Returns (generated ids, logits [n_steps][vocab]).
    Row 0 = logits after the prompt; row i = logits after feeding generated token i-1.
    Argmax ties resolve to the lowest id (np.argmax)."""
    m = model if isinstance(model, Model) else load_model(model)
    seq = list(prompt_ids)
    gen, rows = [], []
    for s in range(n_steps):
        tr = [] if trace is not None else None
        lg = forward_logits(m, seq, tr)[-1]
        if trace is not None:
            trace.append(tr)
        rows.append(lg)
        nxt = int(np.argmax(lg))
        gen.append(nxt)
        seq.append(nxt)
    return gen, np.array(rows)


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="numpy reference greedy decode")
    ap.add_argument("model_dir")
    ap.add_argument("--tokens", required=True, help="comma-separated prompt ids")
    ap.add_argument("--max-tokens", type=int, default=16)
    a = ap.parse_args()
    try:
        ids, lg = greedy(a.model_dir, [int(x) for x in a.tokens.split(",")], a.max_tokens)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(" ".join(map(str, ids)))
    print("max|logit| per step:", " ".join(f"{v:.3f}" for v in np.abs(lg).max(1)))
