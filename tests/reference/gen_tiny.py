#!/usr/bin/python3
"""Write tiny random-weight Hugging Face MoE checkpoints derived from real configs.

usage: gen_tiny.py OUTDIR [--configs DIR] [--only NAME[,NAME...]]

For each checkpoint NAME it writes OUTDIR/NAME/ with config.json,
model.safetensors (mixtral: two shards + model.safetensors.index.json),
tokenizer.json (byte-level BPE), tokenizer_config.json, generation_config.json,
and OUTDIR/manifest.json describing what was written (or skipped).

The real configs come from <repo>/../shared/data/configs (override with
--configs). Every behavioural flag of the real config is kept; only sizes
shrink. Weights are float32 from numpy.random.default_rng(seed); the seed is
the first of a fixed sequence for which the numpy reference (ref_numpy.py)
shows non-degenerate logits, clear greedy margins, routing that varies across
tokens and no near-ties at the top-k boundary (so an f32 engine cannot
legitimately pick a different expert or token than the f64 reference).
"""

import argparse
import copy
import json
import os
import re
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ref_numpy as R  # noqa: E402

REPO = os.path.dirname(os.path.dirname(HERE))           # directory containing tests/
SHARED_CONFIGS = os.path.join(REPO, "..", "shared", "data", "configs")
# copies of the same four files, for a clone without ../shared
VENDORED_CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
DEFAULT_CONFIGS = SHARED_CONFIGS if os.path.isdir(SHARED_CONFIGS) else VENDORED_CONFIGS

PROMPT = [17, 300, 3, 101, 257, 42, 7]   # 7 ids; 257/300 are merged BPE tokens
N_STEPS = 16
VOCAB = 320                               # model vocab; tokenizer uses fewer ids (like OLMoE)
MAX_POS = 128

# ------------------------------------------------------------------ tokenizer

BPE_TEXT = ("the quick brown fox jumps over the lazy dog. the dog sleeps while the fox "
            "runs; then the fox and the dog eat the same bread, and they rest together "
            "under the tree until the sun sets over the hills.")
N_MERGES = 47          # 256 byte tokens + 47 merges + <|endoftext|> = 304 <= VOCAB
EOS = "<|endoftext|>"


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return bs, [chr(x) for x in cs]


# ASCII approximation of the GPT-2 pre-tokenizer regex (enough for BPE_TEXT)
_PAT = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""")


def train_bpe():
    bs, cs = bytes_to_unicode()
    b2u = dict(zip(bs, cs))
    vocab = {cs[i]: i for i in range(256)}          # GPT-2 order: printable bytes first
    words = {}
    for w in _PAT.findall(BPE_TEXT):
        key = tuple(b2u[b] for b in w.encode("utf-8"))
        words[key] = words.get(key, 0) + 1
    merges = []
    while len(merges) < N_MERGES:
        pairs = {}
        for w, n in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + n
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))   # most frequent, then lexicographic
        merged = best[0] + best[1]
        merges.append(best)
        if merged not in vocab:
            vocab[merged] = len(vocab)
        nw = {}
        for w, n in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            nw[tuple(out)] = nw.get(tuple(out), 0) + n
        words = nw
    eos_id = len(vocab)
    return vocab, merges, eos_id


def tokenizer_json(vocab, merges, eos_id):
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": eos_id, "content": EOS, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": dict(bl),
        "post_processor": dict(bl, trim_offsets=False),
        "decoder": dict(bl),
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "",
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": dict(list(vocab.items()) + [(EOS, eos_id)]),
                  "merges": [f"{a} {b}" for a, b in merges]},
    }


# ------------------------------------------------------------------ safetensors

def st_bytes(tensors):
    """tensors: list of (name, ndarray) -> bytes of a safetensors file; a uint8
    array is written as F8_E4M3 codes, a uint16 one as BF16 bits, anything
    else as F32."""
    header = {"__metadata__": {"format": "pt"}}
    off = 0
    blobs = []
    for name, a in tensors:
        dt = {np.dtype(np.uint8): "F8_E4M3", np.dtype(np.uint16): "BF16"}.get(a.dtype, "F32")
        if dt == "F8_E4M3" and name.endswith(("_blocks", "_scales")):
            dt = "U8"   # MXFP4's packed pairs and E8M0 exponents
        a = np.ascontiguousarray(a, dtype={"F8_E4M3": np.uint8, "U8": np.uint8,
                                           "BF16": "<u2"}.get(dt, "<f4"))
        b = a.tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def write_checkpoint(d, tensors, shards):
    os.makedirs(d, exist_ok=True)
    for fn in os.listdir(d):
        if fn.endswith(".safetensors") or fn == "model.safetensors.index.json":
            os.remove(os.path.join(d, fn))
    if shards == 1:
        with open(os.path.join(d, "model.safetensors"), "wb") as f:
            f.write(st_bytes(tensors))
        return
    total = sum(a.size * 4 for _, a in tensors)
    parts, cur, acc = [[] for _ in range(shards)], 0, 0
    for name, a in tensors:
        if acc >= total * (cur + 1) / shards and cur < shards - 1:
            cur += 1
        parts[cur].append((name, a))
        acc += a.size * 4
    wm = {}
    for i, p in enumerate(parts):
        fn = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        with open(os.path.join(d, fn), "wb") as f:
            f.write(st_bytes(p))
        for name, _ in p:
            wm[name] = fn
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(wm.items()))}, f, indent=2)


# ------------------------------------------------------------------ configs

SIZE = dict(vocab_size=VOCAB, max_position_embeddings=MAX_POS, num_hidden_layers=3)

# name -> (real config file, size overrides, extra behavioural overrides, seed base, shards)
SPECS = {
    "mixtral": ("Mixtral-8x7B-v0.1.json",
                dict(hidden_size=128, num_attention_heads=8, num_key_value_heads=2,  # GQA 4:1 as real
                     intermediate_size=32, num_local_experts=8, num_experts_per_tok=2),
                {}, 1000, 2),
    "qwen2_moe": ("Qwen1.5-MoE-A2.7B.json",
                  dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                       intermediate_size=128, moe_intermediate_size=32,
                       shared_expert_intermediate_size=128, num_experts=8, num_experts_per_tok=4),
                  {}, 2000, 1),
    "qwen3_moe": ("Qwen3-30B-A3B.json",
                  dict(hidden_size=64, num_attention_heads=16, num_key_value_heads=2,  # GQA 8:1 as real
                       head_dim=16,  # explicit, != hidden/heads (=4), q width 256 != hidden
                       intermediate_size=96, moe_intermediate_size=32, num_experts=16,
                       num_experts_per_tok=8, max_window_layers=3),
                  {}, 3000, 1),
    "olmoe": ("OLMoE-1B-7B-0924.json",
              dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                   intermediate_size=32, num_experts=16, num_experts_per_tok=8),
              {}, 4000, 1),
    # --- variants
    "qwen3_moe_yarn": ("Qwen3-30B-A3B.json",
                       dict(hidden_size=64, num_attention_heads=16, num_key_value_heads=2, head_dim=16,
                            intermediate_size=96, moe_intermediate_size=32, num_experts=16,
                            num_experts_per_tok=8, max_window_layers=3),
                       # max_position_embeddings / original = 128/32 = factor, so HF 4.4x-4.5x
                       # (factor := ratio) and v5 (factor from config) agree
                       {"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                         "original_max_position_embeddings": 32}},
                       5000, 1),
    # the same checkpoint (same seed base, so the same weights) with its RoPE in the
    # transformers v5 layout: rope_theta and the yarn scaling inside rope_parameters
    "qwen3_moe_yarn_v5": ("Qwen3-30B-A3B.json",
                          dict(hidden_size=64, num_attention_heads=16, num_key_value_heads=2, head_dim=16,
                               intermediate_size=96, moe_intermediate_size=32, num_experts=16,
                               num_experts_per_tok=8, max_window_layers=3),
                          lambda c: v5_rope_layout(c, {"rope_type": "yarn", "factor": 4.0,
                                                       "original_max_position_embeddings": 32}),
                          5000, 1),
    "qwen3_moe_dense_layers": ("Qwen3-30B-A3B.json",
                               dict(hidden_size=64, num_attention_heads=16, num_key_value_heads=2,
                                    head_dim=16, intermediate_size=96, moe_intermediate_size=32,
                                    num_experts=16, num_experts_per_tok=8, num_hidden_layers=4,
                                    max_window_layers=4),
                               # layer 0: dense (step), 1: MoE, 2: dense (step), 3: dense (mlp_only)
                               {"decoder_sparse_step": 2, "mlp_only_layers": [3]},
                               6000, 1),
    "olmoe_tied_clip": ("OLMoE-1B-7B-0924.json",
                        dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                             intermediate_size=32, num_experts=16, num_experts_per_tok=8),
                        {"tie_word_embeddings": True, "clip_qkv": 1.5},
                        7000, 1),
    # --- the frontier families (issue 14): MLA, sigmoid group routing, shared
    # experts, leading dense layers, MTP layers in the file
    "deepseek_v2": ("DeepSeek-V2-Lite.json",          # no q-LoRA, softmax greedy, 2 shared
                    dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                         q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16,
                         qk_rope_head_dim=8, v_head_dim=16, intermediate_size=96,
                         moe_intermediate_size=32, n_routed_experts=16, num_experts_per_tok=6),
                    {}, 8000, 1),
    "deepseek_v2_grouped": ("DeepSeek-V2-Lite.json",  # DeepSeek-V2's group_limited_greedy
                            dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                                 q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16,
                                 qk_rope_head_dim=8, v_head_dim=16, intermediate_size=96,
                                 moe_intermediate_size=32, n_routed_experts=16,
                                 num_experts_per_tok=6),
                            {"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2,
                             "routed_scaling_factor": 16.0},
                            8100, 1),
    "deepseek_v3": ("DeepSeek-V3-Base.json",          # q-LoRA, noaux_tc 4 groups / top 2, MTP
                    dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                         q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16,
                         qk_rope_head_dim=8, v_head_dim=16, intermediate_size=96,
                         moe_intermediate_size=32, n_routed_experts=16, num_experts_per_tok=4,
                         n_group=4, topk_group=2, first_k_dense_replace=1),
                    lambda c: c.pop("quantization_config", None),
                    8200, 1),
    "kimi_k2": ("Kimi-K2-Instruct.json",              # one group, x2.827, rope theta 5e4 YaRN x32
                dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                     q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
                     v_head_dim=16, intermediate_size=96, moe_intermediate_size=32,
                     n_routed_experts=24, num_experts_per_tok=4),
                lambda c: c.pop("quantization_config", None),
                8300, 1),
    "glm4_moe": ("GLM-4.5-Air-arch.INTELLECT-3-Base.json",  # GQA 4:1 + bias, partial rotary, MTP
                 dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=2, head_dim=16,
                      intermediate_size=96, moe_intermediate_size=32, n_routed_experts=16,
                      num_experts_per_tok=4),
                 {}, 8400, 1),
    "glm4_moe_qknorm": ("GLM-4.5-Air-arch.INTELLECT-3-Base.json",  # GLM-4.5's QK-norm, 2 groups
                        dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=2,
                             head_dim=16, intermediate_size=96, moe_intermediate_size=32,
                             n_routed_experts=16, num_experts_per_tok=4),
                        {"use_qk_norm": True, "n_group": 2, "topk_group": 1,
                         "routed_scaling_factor": 2.5},
                        8500, 1),
    # gpt-oss (issue 16): sinks, q/k/v/o biases, alternating windows shrunk to 4
    # keys so the 7-token prompt slides, and swiglu_limit lowered to 0.8 so the
    # clamp of gate and up acts on these weights (the real 7.0 would not)
    "gpt_oss": ("gpt-oss-20b.json",
                dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=2, head_dim=16,
                     intermediate_size=32, num_local_experts=8, num_experts_per_tok=2,
                     experts_per_token=2),
                lambda c: (c.pop("quantization_config", None),
                           c.update(sliding_window=4, swiglu_limit=0.8,
                                    layer_types=["sliding_attention", "full_attention",
                                                 "sliding_attention"])),
                8800, 1),
}


# FP8 checkpoints (DeepSeek-V3's layout): every linear weight but the
# embeddings, lm_head and routers stored as F8_E4M3 codes with an F32
# `<name>_scale_inv` per 128 x 128 block (make_fp8). Shapes are chosen so
# that partial blocks appear in both dimensions (hidden 200, expert FFN 136).
FP8_BLOCK = 128
FP8_QUANT_CONFIG = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                    "weight_block_size": [FP8_BLOCK, FP8_BLOCK]}
SPECS["qwen3_moe_fp8"] = ("Qwen3-30B-A3B.json",
                          dict(hidden_size=200, num_attention_heads=4, num_key_value_heads=2,
                               head_dim=32, intermediate_size=96, moe_intermediate_size=136,
                               num_experts=8, num_experts_per_tok=2, max_window_layers=3),
                          {"quantization_config": FP8_QUANT_CONFIG}, 8000, 1)
# DeepSeek-V3 and Kimi-K2 as shipped: FP8 with their real quantization_config,
# every MLA projection with partial blocks (hidden 200, q-LoRA 136, latent 136)
_DS_FP8 = dict(hidden_size=200, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=136,
               kv_lora_rank=136, qk_nope_head_dim=64, qk_rope_head_dim=16, v_head_dim=64,
               intermediate_size=160, moe_intermediate_size=136, num_experts_per_tok=3)
SPECS["deepseek_v3_fp8"] = ("DeepSeek-V3-Base.json",
                            dict(_DS_FP8, n_routed_experts=8, n_group=4, topk_group=2,
                                 first_k_dense_replace=1),
                            {}, 8600, 1)
SPECS["kimi_k2_fp8"] = ("Kimi-K2-Instruct.json", dict(_DS_FP8, n_routed_experts=12), {}, 8700, 1)
FP8_SPECS = {"qwen3_moe_fp8", "deepseek_v3_fp8", "kimi_k2_fp8"}

# BF16 checkpoints, as most of these models ship: every tensor rounded to
# bfloat16 (nearest, ties to even), which the reference reads exactly
for _name in ("deepseek_v3", "glm4_moe", "gpt_oss"):
    _fn, _sizes, _extra, _seed, _shards = SPECS[_name]
    SPECS[_name + "_bf16"] = (_fn, _sizes, _extra, _seed + 50, _shards)
BF16_SPECS = {"deepseek_v3_bf16", "glm4_moe_bf16", "gpt_oss_bf16"}

# gpt-oss as shipped: its routed experts MXFP4 (quantization_config kept),
# everything else BF16
_fn, _sizes, _extra, _seed, _shards = SPECS["gpt_oss"]
SPECS["gpt_oss_mxfp4"] = (_fn, _sizes, lambda c: (_extra(c), c.update(
    quantization_config={"modules_to_not_convert": ["model.layers.*.self_attn",
                                                    "model.layers.*.mlp.router",
                                                    "model.embed_tokens", "lm_head"],
                         "quant_method": "mxfp4"})), _seed + 70, _shards)
MXFP4_SPECS = {"gpt_oss_mxfp4"}
E2M1_POS = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def make_mxfp4(tensors):
    """gpt-oss's layout: experts.gate_up_proj / down_proj (input-major
    [n, in, out]) become X_blocks [n, out, in/32, 16] and X_scales [n, out,
    in/32]: per 32 inputs an E8M0 exponent e = ceil(log2(amax / 6)) and
    E2M1 codes of w / 2^e (nearest, the lower code on ties; low nibble =
    even element); the rest BF16."""
    out = []
    for name, a in tensors:
        if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            out += make_bf16([(name, a)])
            continue
        w = np.ascontiguousarray(a.transpose(0, 2, 1), dtype=np.float64)  # [n, out, in]
        n, rows, cols = w.shape
        blk = w.reshape(n, rows, cols // 32, 32)
        amax = np.abs(blk).max(-1)
        e = np.ceil(np.log2(np.maximum(amax, 1e-30) / 6.0)).astype(np.int64)
        e = np.clip(e, -60, 60)
        v = blk / np.exp2(e)[..., None]
        mag = np.abs(v)
        idx = np.abs(mag[..., None] - E2M1_POS).argmin(-1)             # nearest magnitude
        code = (idx | np.where(np.signbit(v) & (idx > 0), 8, 0)).astype(np.uint8)
        out.append((name + "_blocks", (code[..., 0::2] | (code[..., 1::2] << 4)).astype(np.uint8)))
        out.append((name + "_scales", (e + 127).astype(np.uint8)))
    return out


def make_bf16(tensors):
    """f32 arrays -> bf16 bit patterns (uint16), round to nearest even."""
    out = []
    for name, a in tensors:
        u = np.ascontiguousarray(a, dtype="<f4").view("<u4").astype(np.uint64)
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        out.append((name, u.astype(np.uint16)))
    return out


def e4m3_encode(x):
    """f64/f32 array -> E4M3FN codes (uint8), round to nearest, ties to the even
    code, saturating at 448 (|x| is at most 448 here by construction)."""
    mags = R.e4m3_decode(np.arange(0x7f, dtype=np.uint8))   # codes 0x00..0x7e, increasing
    a = np.minimum(np.abs(np.asarray(x, np.float64)), 448.0)
    hi = np.clip(np.searchsorted(mags, a, side="left"), 0, 0x7e)
    lo = np.maximum(hi - 1, 0)
    dlo, dhi = a - mags[lo], mags[hi] - a
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    return (pick | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


def make_fp8(tensors):
    """Quantize the linear weights as DeepSeek-V3 ships them: per 128 x 128 block
    scale = amax / 448 (its weight/act quantization rule), codes = E4M3(w / scale);
    the dequantized weight is code * scale (weight_dequant in DeepSeek-V3's
    inference/kernel.py). Embeddings, lm_head, routers, norms and biases stay F32."""
    out = []
    B = FP8_BLOCK
    for name, a in tensors:
        if (a.ndim != 2 or name in ("model.embed_tokens.weight", "lm_head.weight")
                or name.endswith("mlp.gate.weight") or name.endswith("block_sparse_moe.gate.weight")):
            out.append((name, a))
            continue
        r, c = a.shape
        nbr, nbc = -(-r // B), -(-c // B)
        scale = np.zeros((nbr, nbc), np.float32)
        codes = np.zeros((r, c), np.uint8)
        for i in range(nbr):
            for j in range(nbc):
                blk = a[i * B:(i + 1) * B, j * B:(j + 1) * B].astype(np.float32)
                s = np.float32(max(float(np.abs(blk).max()), 1e-12) / 448.0)
                scale[i, j] = s
                codes[i * B:(i + 1) * B, j * B:(j + 1) * B] = e4m3_encode(blk / s)
        out.append((name, codes))
        out.append((name + "_scale_inv", scale))
    return out


# checkpoints that must give byte-identical engine logits: name -> twin
SAME_LOGITS_AS = {"qwen3_moe_yarn_v5": "qwen3_moe_yarn"}


def v5_rope_layout(c, scaling):
    """Move the config's RoPE into one transformers-v5 rope_parameters object."""
    c.pop("rope_scaling", None)
    c["rope_parameters"] = dict(scaling, rope_theta=c.pop("rope_theta"))


def derive_config(real, sizes, extra, eos_id):
    c = copy.deepcopy(real)
    c.pop("_name_or_path", None)
    c.update(SIZE)
    c.update(sizes)
    if callable(extra):
        extra(c)
    else:
        c.update(extra)
    c.pop("auto_map", None)
    c["torch_dtype"] = "float32"
    c["eos_token_id"] = eos_id
    if "bos_token_id" in c:
        c["bos_token_id"] = eos_id
    if "pad_token_id" in c:
        c["pad_token_id"] = eos_id
    return c


# ------------------------------------------------------------------ weights

def make_weights(cfg, seed):
    c = R.normalize_config(cfg)
    rng = np.random.default_rng(seed)
    out = []
    for name, shape in R.expected_tensors(c).items():
        if name.endswith("norm.weight") or "layernorm" in name:
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name == "model.embed_tokens.weight":
            # tied: a small embedding keeps the residual from echoing the input token
            a = (0.25 if c["tie_word_embeddings"] else 1.0) * rng.standard_normal(shape)
        elif name == "lm_head.weight":
            a = 2.0 * rng.standard_normal(shape) / np.sqrt(shape[1])
        elif name.endswith("self_attn.sinks"):
            a = rng.standard_normal(shape)          # a logit per head, as trained sinks are
        elif name.endswith("e_score_correction_bias"):
            a = 0.1 * rng.standard_normal(shape)   # moves choices, as trained biases do
        elif name.endswith(".bias"):
            a = 0.5 * rng.standard_normal(shape)
        elif name.endswith("gate.weight") and ("block_sparse_moe.gate" in name or name.endswith("mlp.gate.weight")) \
                or name.endswith("mlp.router.weight"):
            a = 2.0 * rng.standard_normal(shape) / np.sqrt(shape[1])      # router: spread routing
        else:
            a = rng.standard_normal(shape) / np.sqrt(shape[1])
        out.append((name, a.astype(np.float32)))
    # MTP layers (num_nextn_predict_layers): in the file after the decoder
    # layers, complete (DeepSeek-V3's names); the trunk's weights above are
    # drawn first, so they do not depend on them
    for name, shape in R.expected_tensors(c, mtp=True).items():
        if name.endswith("norm.weight") or "layernorm" in name:
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith("e_score_correction_bias"):
            a = 0.1 * rng.standard_normal(shape)
        elif name.endswith("mlp.gate.weight"):
            a = 2.0 * rng.standard_normal(shape) / np.sqrt(shape[1])
        else:
            a = rng.standard_normal(shape) / np.sqrt(shape[1] if len(shape) > 1 else 1)
        out.append((name, a.astype(np.float32)))
    return out


def check(d, eos_id):
    """Run the reference from disk; return (ok, reason, stats)."""
    m = R.load_model(d)
    trace = []
    ids, lg = R.greedy(m, PROMPT, N_STEPS, trace=trace)
    mx = np.abs(lg).max(1)
    srt = np.sort(lg, axis=1)
    margin = ((srt[:, -1] - srt[:, -2]) / mx).min()
    # routing: the final step's trace covers every position once
    last = trace[-1]
    gaps = [g for tr in trace for (_, _, _, g) in tr]
    per_layer = {}
    for (i, t, sel, g) in last:
        per_layer.setdefault(i, []).append(sel)
    distinct = min(len(set(v)) for v in per_layer.values()) if per_layer else 0
    used = min(len(set(e for s in v for e in s)) for v in per_layer.values()) if per_layer else 0
    stats = dict(ids=ids, logits=lg, max_logit=float(mx.min()), greedy_margin=float(margin),
                 route_gap=float(min(gaps)) if gaps else None, distinct_routes=distinct,
                 experts_used=used, moe_layers=sorted(per_layer))
    if mx.min() < 1.0:
        return False, "logits degenerate", stats
    if margin < 2e-3:
        return False, "greedy near-tie", stats
    if eos_id in ids:
        return False, "generates eos", stats
    if len(set(ids)) < 4:
        return False, "generation too repetitive", stats
    if not per_layer:
        return False, "no MoE layer", stats
    if min(gaps) < 1e-4:
        return False, "top-k boundary near-tie", stats
    k, E = m.c["top_k"], m.c["n_experts"]
    if distinct < 3 or used < min(E, k + 2):
        return False, "routing does not vary", stats
    return True, "", stats


def encode(text, vocab, merges):
    """GPT-2 byte-level BPE encode (ASCII pre-tokenizer approximation); for test vectors."""
    bs, cs = bytes_to_unicode()
    b2u = dict(zip(bs, cs))
    rank = {m: i for i, m in enumerate(merges)}
    ids = []
    for w in _PAT.findall(text):
        parts = [b2u[b] for b in w.encode("utf-8")]
        while len(parts) > 1:
            cand = [(rank.get((a, b), 1 << 30), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
            r, i = min(cand)
            if r == 1 << 30:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        ids += [vocab[p] for p in parts]
    return ids


TOKENIZER_TEXTS = ["the fox", "Hello, world!", "the dog sleeps over the hills.", " spaces  and\ttabs\n"]


def generate(outdir, configs=DEFAULT_CONFIGS, only=None, verbose=True):
    """Write the checkpoints; return (manifest, {name: reference logits [N_STEPS][VOCAB]})."""
    names = [n for n in SPECS if not only or n in only]
    os.makedirs(outdir, exist_ok=True)
    vocab, merges, eos_id = train_bpe()
    assert eos_id < VOCAB
    tok = tokenizer_json(vocab, merges, eos_id)
    inv = {v: k for k, v in vocab.items()}
    bs, cs = bytes_to_unicode()
    u2b = dict(zip(cs, bs))
    vectors = []
    for t in TOKENIZER_TEXTS:
        ids = encode(t, vocab, merges)
        assert bytes(u2b[ch] for i in ids for ch in inv[i]).decode() == t
        vectors.append({"text": t, "ids": ids})
    manifest = {"prompt": PROMPT, "n_steps": N_STEPS, "eos_token_id": eos_id,
                "tokenizer_vectors": vectors, "models": {}}
    ref_logits = {}
    for name in names:
        fn, sizes, extra, seed0, shards = SPECS[name]
        src = os.path.join(configs, fn)
        if not os.path.exists(src):
            if verbose:
                print(f"SKIP: {name}: {os.path.normpath(src)} not found (../shared/data/configs not found)")
            manifest["models"][name] = {"skipped": f"{os.path.normpath(src)} not found"}
            continue
        with open(src) as f:
            real = json.load(f)
        cfg = derive_config(real, sizes, extra, eos_id)
        d = os.path.join(outdir, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
        with open(os.path.join(d, "tokenizer.json"), "w") as f:
            json.dump(tok, f, ensure_ascii=False)
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump({"eos_token": EOS, "bos_token": EOS, "unk_token": None,
                       "model_max_length": MAX_POS, "tokenizer_class": "GPT2Tokenizer",
                       "add_prefix_space": False}, f, indent=2)
        with open(os.path.join(d, "generation_config.json"), "w") as f:
            json.dump({"bos_token_id": eos_id, "eos_token_id": eos_id}, f, indent=2)
        ok = False
        for seed in range(seed0, seed0 + 50):
            w = make_weights(cfg, seed)
            write_checkpoint(d, make_fp8(w) if name in FP8_SPECS else
                             make_bf16(w) if name in BF16_SPECS else
                             make_mxfp4(w) if name in MXFP4_SPECS else w, shards)
            ok, why, st = check(d, eos_id)
            if ok:
                break
        if not ok:
            if verbose:
                print(f"FAIL: {name}: no seed in [{seed0},{seed0 + 50}) passes the checks (last: {why})")
            manifest["models"][name] = {"failed": why}
            continue
        # the generator's own guarantees (see check()):
        assert st["max_logit"] > 1.0, name
        assert st["distinct_routes"] >= 3 and st["route_gap"] >= 1e-4, name
        ref_logits[name] = st.pop("logits")
        manifest["models"][name] = {"model_type": cfg["model_type"], "seed": seed, "shards": shards,
                                    "ref_ids": st["ids"]}
        if verbose:
            print(f"wrote {name:24s} {cfg['model_type']:9s} seed={seed} min max|logit|={st['max_logit']:.2f} "
                  f"greedy margin={st['greedy_margin']:.3f} route gap={st['route_gap']:.2e} "
                  f"distinct top-k sets={st['distinct_routes']} experts used={st['experts_used']} "
                  f"moe layers={st['moe_layers']}")
    with open(os.path.join(outdir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest, ref_logits


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--configs", default=DEFAULT_CONFIGS)
    ap.add_argument("--only", default="", help="comma-separated subset of: " + ",".join(SPECS))
    a = ap.parse_args()
    man, _ = generate(a.outdir, a.configs, [x for x in a.only.split(",") if x])
    return 1 if any("failed" in v for v in man["models"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
