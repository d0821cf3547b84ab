#!/usr/bin/python3
"""`shoal run FILE.gguf` (issue 30) on GGUF files this test writes from the
bundled checkpoint (models/shakespeare-moe, a qwen3_moe with BF16 weights).

usage: /usr/bin/python3 tests/cli/test_run_gguf.py --shoal build-test/coordinator/shoal

The files are written here with the stdlib (struct) and Debian's numpy: the
safetensors file is read by hand (8-byte header length, JSON, data), its
tensors renamed as llama.cpp's convert_hf_to_gguf.py does for qwen3moe
(Qwen3MoeModel: no q/k permutation; the experts of a layer stacked into
blk.N.ffn_{gate,up,down}_exps, ne = {n_in, n_out, n_expert}), the metadata
keys those of its Qwen2MoeModel.set_gguf_parameters.

Cases:
  bf16:     matrices BF16, norms F32 (as llama.cpp keeps them): the logits of
            16 greedy steps are the bytes of the checkpoint's run (the same
            weights, the same engine); the key correctness test
  f32:      every tensor F32: the same bytes again
  q8_0:     the experts Q8_0 (ggml's rule: blocks of 32, d = amax / 127 as
            f16, q = round(x / d)), the rest BF16: each step's logits within
            cosine 0.99 of the BF16 run while the tokens agree, the same
            bytes at --threads 1 and 2
  q8_0-all: every matrix Q8_0, token_embd included (the embedding row
            dequantized, the tied lm_head through the Q8_0 kernel): the
            same checks
  k-quants: the Q4_K and Q6_K writers below (per 32 / 16 elements min-max
            and amax scales, packed as ggml's quantize_row_q{4,6}_K_ref
            pack them) checked first: the test's decoder gives gguf-py's
            floats on tests/data/gguf's vectors, and it decodes the
            writers' blocks to within one step of their input. Then a file
            with Q4_K experts (ffn_down_exps Q8_0: 192 columns are not a
            multiple of 256) and every other matrix Q6_K (token_embd and
            the router included): the same bytes at --threads 1 and 2,
            cosine 0.98 to the BF16 run while the tokens agree
  random types: the experts as random valid blocks of Q5_K, Q2_K, Q3_K,
            IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S (gate,
            up) and IQ4_NL, MXFP4 (down), a type per layer, in three files; the test's decoders
            of those types give gguf-py's floats on tests/data/gguf's
            vectors first. Each file: the same bytes at --threads 1 and 2,
            greedy tokens and cosine 0.9999 to the file of the same
            weights decoded to F32 (only the activations' int8 differs)
  scales:   a NaN or infinite f16 block scale (d, dmin) in a Q6_K trunk
            matrix: exit 2 at load, one line naming tensor, block, value;
            in a Q4_K or Q8_0 expert: the same line (and the expert) the
            first time it runs, exit 1
  vocab:    the file's own vocabulary (tokenizer.ggml.*, from the bundled
            tokenizer.json) gives the checkpoint's text for --prompt; a
            bos (add_bos_token true) or eos id past the vocabulary: exit 2,
            one line saying the id is out of range
  bad:      another architecture, a missing key, a key shoal does not read,
            a tensor of a type shoal does not run, a wrong shape, an
            unexpected tensor: exit 2, one line naming what (workers
            serving a GGUF: tests/cli/test_gguf_stream.py); a .gguf path
            that does not exist: exit 2, the line names GGUF files
Ends with "N passed, M failed"; exit status 1 if anything failed.
"""

import argparse
import json
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import harness as H  # noqa: E402
from gguf_writer import encode_float, kv, q8_0_bytes, read_safetensors, s_  # noqa: E402,F401
import gguf_writer  # noqa: E402

result = H.Results()
MODEL = H.MODEL
ARGS = ["--tokens", "1,2,3", "--max-tokens", "16", "--greedy"]

from gguf_writer import GGML  # noqa: E402  (extended below with the types of the mixes)


# ---- reading the checkpoint ------------------------------------------------

def gguf_tensors(st, n_layer, n_expert):
    """[(llama.cpp name, float32 array in C order, is_matrix)] for qwen3moe."""
    t = [("token_embd.weight", st["model.embed_tokens.weight"]),
         ("output_norm.weight", st["model.norm.weight"])]
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
             "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm",
             "mlp.gate": "ffn_gate_inp"}
    for il in range(n_layer):
        p = "model.layers.%d." % il
        for hf, ll in names.items():
            t.append(("blk.%d.%s.weight" % (il, ll), st[p + hf + ".weight"]))
        for proj, ll in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")):
            x = np.stack([st[p + "mlp.experts.%d.%s.weight" % (ie, proj)]
                          for ie in range(n_expert)])
            t.append(("blk.%d.ffn_%s_exps.weight" % (il, ll), x))
    return t


# ---- writing GGUF ------------------------------------------------------------

def _f16(b, off):
    """The f16 at byte off of each block row of b [n][size] uint8, as f32."""
    return b[:, off:off + 2].copy().view("<f2").astype(np.float32)[:, 0]


def _scale_min_k4(scales, j):
    """ggml's get_scale_min_k4 over scales [n][12] uint8: (sc, m) [n] int."""
    s = scales.astype(np.int32)
    if j < 4:
        return s[:, j] & 63, s[:, j + 4] & 63
    return ((s[:, j + 4] & 0x0F) | (s[:, j - 4] >> 6) << 4,
            (s[:, j + 4] >> 4) | (s[:, j] >> 6) << 4)


def q4_k_decode(raw):
    """Q4_K blocks -> float32 [n][256], ggml_dequant.c's rule step for step
    (d1 = d * sc, m1 = dmin * m, y = d1 * q - m1, each one f32 operation)."""
    b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 144)
    d, dmin, qs = _f16(b, 0), _f16(b, 2), b[:, 16:]
    y = np.empty((len(b), 256), dtype=np.float32)
    for ib in range(8):
        sc, m = _scale_min_k4(b[:, 4:16], ib)
        d1, m1 = d * sc.astype(np.float32), dmin * m.astype(np.float32)
        q = (qs[:, 32 * (ib // 2):32 * (ib // 2) + 32] >> (4 * (ib % 2))) & 0x0F
        y[:, 32 * ib:32 * ib + 32] = d1[:, None] * q.astype(np.float32) - m1[:, None]
    return y


def q6_k_decode(raw):
    """Q6_K blocks -> float32 [n][256] (ggml_dequant.c's rule)."""
    b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 210)
    ql, qh = b[:, :128].astype(np.int32), b[:, 128:192].astype(np.int32)
    sc = b[:, 192:208].view(np.int8).astype(np.float32)
    d = _f16(b, 208)
    y = np.empty((len(b), 256), dtype=np.float32)
    for h in range(2):
        for r in range(4):
            for half in range(2):
                l = np.arange(16 * half, 16 * half + 16)
                lo = (ql[:, 64 * h + l + 32 * (r % 2)] >> (4 * (r // 2))) & 0x0F
                hi = (qh[:, 32 * h + l] >> (2 * r)) & 3
                ds = d * sc[:, 8 * h + half + 2 * r]
                y[:, 128 * h + 32 * r + l] = ds[:, None] * ((lo | hi << 4) - 32).astype(np.float32)
    return y


# ---- decoders of the types written as random blocks (issue 30) --------------
# Each is ggml_dequant.c's rule, one f32 operation per step in its order, so
# it gives gguf-py's floats bit for bit (checked on tests/data/gguf's vectors
# in test_decoders); the IQ grids are gguf-py's, read from that folder.

DATA = os.path.join(os.path.dirname(HERE), "data", "gguf")
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10,
                          1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)
KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12],
                         dtype=np.float32)


def _grid(name, width):
    with open(os.path.join(DATA, "grid_%s.i8" % name), "rb") as f:
        return np.frombuffer(f.read(), dtype=np.int8).reshape(-1, width).astype(np.float32)


def _blocks(raw, size):
    return np.frombuffer(raw, dtype=np.uint8).reshape(-1, size)


def _u32(b, off):
    return b[:, off:off + 4].copy().view("<u4")[:, 0].astype(np.int64)


def _signs(bits7):
    """[n] 7 stored sign bits -> [n][8] +-1 (the 8th bit: even parity)"""
    bits = (bits7[:, None] >> np.arange(7)) & 1
    allb = np.concatenate([bits, bits.sum(axis=1, keepdims=True) & 1], axis=1)
    return np.where(allb == 1, np.float32(-1), np.float32(1))


def q5_k_decode(raw):
    b = _blocks(raw, 176)
    d, dmin, qh, qs = _f16(b, 0), _f16(b, 2), b[:, 16:48], b[:, 48:]
    y = np.empty((len(b), 256), dtype=np.float32)
    for ib in range(8):
        sc, m = _scale_min_k4(b[:, 4:16], ib)
        d1, m1 = d * sc.astype(np.float32), dmin * m.astype(np.float32)
        q = ((qs[:, 32 * (ib // 2):32 * (ib // 2) + 32] >> (4 * (ib % 2))) & 0x0F) | \
            ((qh >> ib) & 1) << 4
        y[:, 32 * ib:32 * ib + 32] = d1[:, None] * q.astype(np.float32) - m1[:, None]
    return y


def q2_k_decode(raw):
    b = _blocks(raw, 84)
    sc, qs, d, dmin = b[:, :16], b[:, 16:80], _f16(b, 80), _f16(b, 82)
    y = np.empty((len(b), 256), dtype=np.float32)
    for e0 in range(0, 256, 16):
        h, s, l = e0 // 128, (e0 // 32) % 4, e0 % 32
        dl = d * (sc[:, e0 // 16] & 0x0F).astype(np.float32)
        ml = dmin * (sc[:, e0 // 16] >> 4).astype(np.float32)
        q = (qs[:, 32 * h + l:32 * h + l + 16] >> (2 * s)) & 3
        y[:, e0:e0 + 16] = dl[:, None] * q.astype(np.float32) - ml[:, None]
    return y


def q3_k_decode(raw):
    b = _blocks(raw, 110)
    hm, qs, sc, d = b[:, :32], b[:, 32:96], b[:, 96:108].astype(np.int32), _f16(b, 108)
    y = np.empty((len(b), 256), dtype=np.float32)
    for e0 in range(0, 256, 16):
        i, h, s, l = e0 // 16, e0 // 128, (e0 // 32) % 4, e0 % 32
        lo = (sc[:, i % 8] >> (4 * (i // 8))) & 0x0F
        hi = (sc[:, 8 + i % 4] >> (2 * (i // 4))) & 3
        dl = d * ((lo | hi << 4) - 32).astype(np.float32)
        q = ((qs[:, 32 * h + l:32 * h + l + 16] >> (2 * s)) & 3).astype(np.int32)
        q = np.where((hm[:, l:l + 16] >> (4 * h + s)) & 1, q, q - 4)
        y[:, e0:e0 + 16] = dl[:, None] * q.astype(np.float32)
    return y


def iq4_nl_decode(raw):
    b = _blocks(raw, 18)
    d, qs = _f16(b, 0), b[:, 2:]
    return np.concatenate([d[:, None] * KVALUES_IQ4NL[qs & 0x0F],
                           d[:, None] * KVALUES_IQ4NL[qs >> 4]], axis=1)


def iq4_xs_decode(raw):
    b = _blocks(raw, 136)
    d, sh, sl, qs = _f16(b, 0), b[:, 2].astype(np.int32) | b[:, 3].astype(np.int32) << 8, \
        b[:, 4:8].astype(np.int32), b[:, 8:]
    y = np.empty((len(b), 256), dtype=np.float32)
    for ib in range(8):
        ls = ((sl[:, ib // 2] >> (4 * (ib % 2))) & 0x0F) | ((sh >> (2 * ib)) & 3) << 4
        dl = d * (ls - 32).astype(np.float32)
        q = qs[:, 16 * ib:16 * ib + 16]
        y[:, 32 * ib:32 * ib + 16] = dl[:, None] * KVALUES_IQ4NL[q & 0x0F]
        y[:, 32 * ib + 16:32 * ib + 32] = dl[:, None] * KVALUES_IQ4NL[q >> 4]
    return y


def iq2_xxs_decode(raw):
    b, grid = _blocks(raw, 66), _grid("iq2_xxs", 8)
    d = _f16(b, 0)
    y = np.empty((len(b), 256), dtype=np.float32)
    for ib in range(8):
        bits = _u32(b, 2 + 8 * ib + 4)
        db = d * (np.float32(0.5) + (bits >> 28).astype(np.float32)) * np.float32(0.25)
        for l in range(4):
            v = db[:, None] * grid[b[:, 2 + 8 * ib + l]]
            y[:, 32 * ib + 8 * l:32 * ib + 8 * l + 8] = v * _signs((bits >> (7 * l)) & 127)
    return y


def iq3_xxs_decode(raw):
    b, grid = _blocks(raw, 98), _grid("iq3_xxs", 4)
    d, qs = _f16(b, 0), b[:, 2:66]
    y = np.empty((len(b), 256), dtype=np.float32)
    for ib in range(8):
        bits = _u32(b, 66 + 4 * ib)
        db = d * (np.float32(0.5) + (bits >> 28).astype(np.float32)) * np.float32(0.5)
        for l in range(4):
            g = np.concatenate([grid[qs[:, 8 * ib + 2 * l]], grid[qs[:, 8 * ib + 2 * l + 1]]],
                               axis=1)
            y[:, 32 * ib + 8 * l:32 * ib + 8 * l + 8] = \
                db[:, None] * g * _signs((bits >> (7 * l)) & 127)
    return y


def _bits8(byte):
    """[n] sign bytes -> [n][8] +-1 (all 8 bits stored: IQ2_S, IQ3_S)"""
    return np.where((byte[:, None] >> np.arange(8)) & 1, np.float32(-1), np.float32(1))


def _iq2_decode(raw, size, name, index, signs, scales):
    """IQ2_XS and IQ2_S: 32 groups of 8 elements, group g's grid entry
    index(b, g) and signs(b, g) [n][8] +-1; the 4-bit scale s of each 16 in
    the bytes at `scales` (low nibble first), y = d (0.5 + s) 0.25 * grid."""
    b, grid = _blocks(raw, size), _grid(name, 8)
    d = _f16(b, 0)
    y = np.empty((len(b), 256), dtype=np.float32)
    for g in range(32):
        s = (b[:, scales + g // 4] >> (4 * ((g % 4) // 2))) & 0x0F
        db = d * (np.float32(0.5) + s.astype(np.float32)) * np.float32(0.25)
        y[:, 8 * g:8 * g + 8] = db[:, None] * grid[index(b, g)] * signs(b, g)
    return y


def _u16(b, off):
    return b[:, off:off + 2].copy().view("<u2")[:, 0].astype(np.int64)


def iq2_xs_decode(raw):
    """u16 per 8 elements: a 9-bit index, 7 sign bits"""
    return _iq2_decode(raw, 74, "iq2_xs", lambda b, g: _u16(b, 2 + 2 * g) & 511,
                       lambda b, g: _signs(_u16(b, 2 + 2 * g) >> 9), 66)


def iq2_s_decode(raw):
    """an index byte at 2, its high 2 bits at 66, a sign byte at 34"""
    return _iq2_decode(raw, 82, "iq2_s",
                       lambda b, g: b[:, 2 + g].astype(np.int64) |
                       ((b[:, 66 + g // 4].astype(np.int64) >> (2 * (g % 4))) & 3) << 8,
                       lambda b, g: _bits8(b[:, 34 + g]), 74)


def iq3_s_decode(raw):
    b, grid = _blocks(raw, 110), _grid("iq3_s", 4)
    d = _f16(b, 0)
    y = np.empty((len(b), 256), dtype=np.float32)
    for ib in range(8):
        s = (b[:, 106 + ib // 2] >> (4 * (ib % 2))) & 0x0F
        db = d * (1 + 2 * s.astype(np.int32)).astype(np.float32)
        for l in range(4):
            k = 8 * ib + 2 * l
            idx = [b[:, 2 + k + h].astype(np.int64) | ((b[:, 66 + ib].astype(np.int64) >>
                                                        (2 * l + h)) & 1) << 8 for h in (0, 1)]
            g = np.concatenate([grid[idx[0]], grid[idx[1]]], axis=1)
            y[:, 32 * ib + 8 * l:32 * ib + 8 * l + 8] = \
                db[:, None] * g * _bits8(b[:, 74 + 4 * ib + l])
    return y


def iq1_s_decode(raw):
    b, grid = _blocks(raw, 50), _grid("iq1_s", 8)
    d, qs = _f16(b, 0), b[:, 2:34].astype(np.int64)
    y = np.empty((len(b), 256), dtype=np.float32)
    for ib in range(8):
        qh = b[:, 34 + 2 * ib].astype(np.int64) | b[:, 35 + 2 * ib].astype(np.int64) << 8
        dl = d * (2 * ((qh >> 12) & 7) + 1).astype(np.float32)
        delta = np.where(qh & 0x8000, np.float32(-0.125), np.float32(0.125))
        for l in range(4):
            g = grid[qs[:, 4 * ib + l] | ((qh >> (3 * l)) & 7) << 8]
            y[:, 32 * ib + 8 * l:32 * ib + 8 * l + 8] = dl[:, None] * (g + delta[:, None])
    return y


def mxfp4_decode(raw):
    b = _blocks(raw, 17)
    e = b[:, 0].astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << 23).astype(np.uint32)
    d, qs = bits.view(np.float32), b[:, 1:]
    return np.concatenate([KVALUES_MXFP4[qs & 0x0F] * d[:, None],
                           KVALUES_MXFP4[qs >> 4] * d[:, None]], axis=1)


# type: (bytes a block, elements, decoder, the block scales' f16 offsets
# (MXFP4: its E8M0 byte))
RANDOM_TYPES = {"Q5_K": (176, 256, q5_k_decode, (0, 2)), "Q2_K": (84, 256, q2_k_decode, (80, 82)),
                "Q3_K": (110, 256, q3_k_decode, (108,)),
                "IQ4_XS": (136, 256, iq4_xs_decode, (0,)), "IQ4_NL": (18, 32, iq4_nl_decode, (0,)),
                "IQ2_XXS": (66, 256, iq2_xxs_decode, (0,)),
                "IQ3_XXS": (98, 256, iq3_xxs_decode, (0,)),
                "IQ1_S": (50, 256, iq1_s_decode, (0,)), "MXFP4": (17, 32, mxfp4_decode, None),
                "IQ2_XS": (74, 256, iq2_xs_decode, (0,)), "IQ2_S": (82, 256, iq2_s_decode, (0,)),
                "IQ3_S": (110, 256, iq3_s_decode, (0,))}
GGML.update({"Q2_K": 10, "Q3_K": 11, "Q5_K": 13, "IQ2_XXS": 16, "IQ2_XS": 17, "IQ3_XXS": 18,
             "IQ1_S": 19, "IQ4_NL": 20, "IQ3_S": 21, "IQ2_S": 22, "IQ4_XS": 23, "MXFP4": 39})


def random_blocks(typ, like, rng):
    """Random valid blocks of typ for a tensor shaped like `like`, their
    scales set so the decoded weights' RMS is about like's: random codes
    with every f16 scale 1 decoded, then every scale c (w is linear in d and
    dmin together); MXFP4's exponent the nearest power of two. Returns the
    bytes and their decoding (float32, like's shape)."""
    size, bs, dec, offs = RANDOM_TYPES[typ]
    n = like.size // bs
    b = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    target = float(np.sqrt(np.mean(np.square(like, dtype=np.float64))))
    if offs is None:
        b[:, 0] = 127   # scale 2^-1
        rms = float(np.sqrt(np.mean(np.square(dec(b.tobytes()), dtype=np.float64))))
        b[:, 0] = int(np.clip(127 + np.round(np.log2(target / rms)), 2, 250))
    else:
        one = np.frombuffer(np.float16(1).astype("<f2").tobytes(), dtype=np.uint8)
        for off in offs:
            b[:, off:off + 2] = one
        rms = float(np.sqrt(np.mean(np.square(dec(b.tobytes()), dtype=np.float64))))
        c = np.frombuffer(np.float16(target / rms).astype("<f2").tobytes(), dtype=np.uint8)
        for off in offs:
            b[:, off:off + 2] = c
    raw = b.tobytes()
    return raw, dec(raw).reshape(like.shape)


def _rint_clip(v, lo, hi):
    return np.clip(np.floor(v + np.float32(0.5)), lo, hi).astype(np.int32)


def q4_k_bytes(x):
    """Q4_K blocks of x (rows a multiple of 256; ggml-common.h block_q4_K).
    Per sub-block of 32: range [min(x, 0), max(x)] in 15 steps; the 6-bit
    scales and mins relative to d = max scale / 63 and dmin = max min / 63
    (f16), packed as ggml's quantize_row_q4_K_ref packs them; q from the
    f16-rounded d and dmin, so the decode is the nearest level."""
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, 8, 32)
    lo = np.minimum(x.min(axis=2), 0)
    scale = (x.max(axis=2) - lo) / np.float32(15)
    d = (scale.max(axis=1) / np.float32(63)).astype("<f2")
    dmin = ((-lo).max(axis=1) / np.float32(63)).astype("<f2")
    d32, dmin32 = d.astype(np.float32), dmin.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = _rint_clip(np.where(d32[:, None] > 0, scale / d32[:, None], 0), 0, 63)
        m = _rint_clip(np.where(dmin32[:, None] > 0, -lo / dmin32[:, None], 0), 0, 63)
        d1 = d32[:, None] * sc.astype(np.float32)
        m1 = dmin32[:, None] * m.astype(np.float32)
        q = _rint_clip(np.where(d1[:, :, None] > 0, (x + m1[:, :, None]) / d1[:, :, None], 0),
                       0, 15)
    n = len(x)
    scales = np.zeros((n, 12), dtype=np.int32)
    for j in range(8):
        if j < 4:
            scales[:, j] = sc[:, j]
            scales[:, j + 4] = m[:, j]
        else:
            scales[:, j + 4] = (sc[:, j] & 0xF) | (m[:, j] & 0xF) << 4
            scales[:, j - 4] |= (sc[:, j] >> 4) << 6
            scales[:, j] |= (m[:, j] >> 4) << 6
    qs = np.zeros((n, 128), dtype=np.int32)
    for j in range(4):
        qs[:, 32 * j:32 * j + 32] = q[:, 2 * j] | q[:, 2 * j + 1] << 4
    blocks = np.zeros(n, dtype=[("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12),
                                ("qs", "u1", 128)])
    blocks["d"], blocks["dmin"] = d, dmin
    blocks["scales"], blocks["qs"] = scales, qs
    return blocks.tobytes()


def q6_k_bytes(x):
    """Q6_K blocks of x (block_q6_K): per sub-block of 16 a scale amax / 31,
    as an int8 relative to d = max scale / 127 (f16); q = round(x / (d *
    sc)) in -32..31, stored + 32 and packed as ggml's quantize_row_q6_K_ref
    packs them."""
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, 16, 16)
    scale = np.abs(x).max(axis=2) / np.float32(31)
    d = (scale.max(axis=1) / np.float32(127)).astype("<f2")
    d32 = d.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = _rint_clip(np.where(d32[:, None] > 0, scale / d32[:, None], 0), 0, 127)
        ds = d32[:, None] * sc.astype(np.float32)
        q = _rint_clip(np.where(ds[:, :, None] > 0, x / ds[:, :, None], 0), -32, 31) + 32
    n = len(x)
    L = q.reshape(n, 256)
    ql = np.zeros((n, 128), dtype=np.int32)
    qh = np.zeros((n, 64), dtype=np.int32)
    for h in range(2):
        j = 128 * h
        for r in range(2):   # ql[l] holds elements l and l + 64, ql[l + 32] l + 32 and l + 96
            ql[:, 64 * h + 32 * r:64 * h + 32 * r + 32] = \
                (L[:, j + 32 * r:j + 32 * r + 32] & 0xF) | \
                (L[:, j + 32 * r + 64:j + 32 * r + 96] & 0xF) << 4
        qh[:, 32 * h:32 * h + 32] = sum((L[:, j + 32 * r:j + 32 * r + 32] >> 4) << (2 * r)
                                        for r in range(4))
    blocks = np.zeros(n, dtype=[("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16),
                                ("d", "<f2")])
    blocks["ql"], blocks["qh"], blocks["scales"], blocks["d"] = ql, qh, sc, d
    return blocks.tobytes()


def encode(x, typ):
    if isinstance(x, tuple):   # (array, its bytes as written)
        return x[1]
    if typ in ("F32", "F16", "BF16"):
        return encode_float(x, typ)
    if typ == "Q8_0":
        return q8_0_bytes(x)
    if typ == "Q4_K":
        return q4_k_bytes(x)
    if typ == "Q6_K":
        return q6_k_bytes(x)
    if typ == "Q8_1":   # only its size matters (a type shoal refuses)
        return bytes(x.size // 32 * 36)
    raise ValueError(typ)


def write_gguf(path, kvs, tensors, align=32, poison=None):
    """tensors: [(name, array or (array, its bytes), ggml type name)]
    (gguf_writer.write_gguf with this test's quantizers)."""
    gguf_writer.write_gguf(path, kvs, tensors, align, poison, encode)


def metadata(cfg, arch="qwen3moe", drop=(), extra=()):
    a = arch
    kvs = [("general.architecture", "str", arch), ("general.name", "str", "shakespeare-moe"),
           (a + ".block_count", "u32", cfg["num_hidden_layers"]),
           (a + ".context_length", "u32", cfg["max_position_embeddings"]),
           (a + ".embedding_length", "u32", cfg["hidden_size"]),
           (a + ".feed_forward_length", "u32", cfg["intermediate_size"]),
           (a + ".expert_feed_forward_length", "u32", cfg["moe_intermediate_size"]),
           (a + ".expert_count", "u32", cfg["num_experts"]),
           (a + ".expert_used_count", "u32", cfg["num_experts_per_tok"]),
           (a + ".attention.head_count", "u32", cfg["num_attention_heads"]),
           (a + ".attention.head_count_kv", "u32", cfg["num_key_value_heads"]),
           (a + ".attention.key_length", "u32", cfg["head_dim"]),
           (a + ".attention.value_length", "u32", cfg["head_dim"]),
           (a + ".attention.layer_norm_rms_epsilon", "f32", cfg["rms_norm_eps"]),
           (a + ".rope.freq_base", "f32", cfg["rope_theta"]),
           ("tokenizer.ggml.bos_token_id", "u32", cfg["bos_token_id"]),
           ("tokenizer.ggml.eos_token_id", "u32", cfg["eos_token_id"])]
    kvs = [k for k in kvs if k[0] not in drop] + list(extra)
    return [kv(*k) for k in kvs]


def typed(tensors, matrix_type, expert_type=None, embd_type=None):
    """Each tensor with its type: 1-D F32, experts expert_type, token_embd
    embd_type, the other matrices matrix_type."""
    out = []
    for name, x in tensors:
        if x.ndim == 1:
            t = "F32"
        elif name.endswith("_exps.weight"):
            t = expert_type or matrix_type
        elif name == "token_embd.weight":
            t = embd_type or matrix_type
        else:
            t = matrix_type
        out.append((name, x, t))
    return out


# ---- the checks --------------------------------------------------------------

def shoal_run(shoal, model, out, *extra):
    r = H.run([shoal, "run", model] + ARGS + ["--logits-out", out] + list(extra),
              timeout=120)
    return r, (np.load(out) if r.returncode == 0 and os.path.exists(out) else None)


def show(r):
    return "exit %d: %s" % (r.returncode, (r.stderr or "").strip()[-400:])


def same_bytes(a, b):
    return a is not None and b is not None and a.shape == b.shape and \
        a.tobytes() == b.tobytes()


def test_exact(shoal, tmp, tensors, kvs, ref):
    for label, matrix in (("bf16", "BF16"), ("f32", "F32")):
        path = os.path.join(tmp, "shakespeare-%s.gguf" % label)
        write_gguf(path, kvs, typed(tensors, matrix))
        r, got = shoal_run(shoal, path, os.path.join(tmp, label + ".npy"))
        diff = "" if got is None or got.shape != ref.shape else \
            "max |diff| %g" % float(np.max(np.abs(got - ref)))
        result("%s GGUF: 16 greedy steps' logits are the checkpoint's bytes" % label,
               r.returncode == 0 and same_bytes(got, ref), show(r) + " " + diff)
        if label == "bf16":
            r2, got2 = shoal_run(shoal, path, os.path.join(tmp, label + "-t1.npy"),
                                 "--threads", "1")
            result("bf16 GGUF: the same bytes at --threads 1", same_bytes(got2, ref), show(r2))
            # shoal plan says it runs, with the bytes it ships
            p = H.run([shoal, "plan", path, "--json"])
            j = json.loads(p.stdout) if p.returncode == 0 else {}
            exps = sum(x.size * 2 for n, x, t in typed(tensors, matrix) if "_exps." in n)
            result("bf16 GGUF: shoal plan says shoal runs it, 4 MoE layers of 8 experts",
                   j.get("runnable") is True and j.get("n_moe_layer") == 4
                   and j.get("n_expert") == 8 and j.get("experts_bytes") == exps,
                   p.stderr.strip() or {k: j.get(k) for k in ("runnable", "n_moe_layer",
                                                               "experts_bytes")})


def cosines(a, b):
    return [float(np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y))) for x, y in zip(a, b)]


def check_quantized(shoal, tmp, label, path, ref, min_cos):
    """A quantized file's run: the same logits bytes at --threads 1 and 2,
    greedy tokens following ref's, each step up to the first differing token
    (which saw the same context) within cosine min_cos of ref's logits."""
    ref_tok = [int(np.argmax(x)) for x in ref]
    r1, a = shoal_run(shoal, path, os.path.join(tmp, label + "-1.npy"), "--threads", "1")
    r2, b = shoal_run(shoal, path, os.path.join(tmp, label + "-2.npy"), "--threads", "2")
    result("%s GGUF: runs (16 greedy steps)" % label,
           r1.returncode == 0 and a is not None and a.shape == ref.shape, show(r1))
    if a is None or a.shape != ref.shape:
        return
    result("%s GGUF: the same logits bytes at --threads 1 and 2" % label,
           same_bytes(a, b), show(r2))
    tok = [int(np.argmax(x)) for x in a]
    agree = 0
    while agree < len(tok) and tok[agree] == ref_tok[agree]:
        agree += 1
    cos = cosines(a[:agree + 1], ref[:agree + 1])
    result("%s GGUF: greedy tokens follow the BF16 run (%d of 16 agree), each such "
           "step's logits within cosine %g (min %.7f)" % (label, agree, min_cos, min(cos)),
           agree >= 4 and min(cos) > min_cos, "tokens %s vs %s" % (tok, ref_tok))
    result("%s GGUF: not the BF16 bytes (the quantized weights are used)" % label,
           a.tobytes() != ref.tobytes())


def test_q8_0(shoal, tmp, tensors, kvs, ref):
    for label, kinds in (("q8_0", dict(matrix_type="BF16", expert_type="Q8_0")),
                         ("q8_0-all", dict(matrix_type="Q8_0"))):
        path = os.path.join(tmp, "shakespeare-%s.gguf" % label)
        write_gguf(path, kvs, typed(tensors, **kinds))
        check_quantized(shoal, tmp, label, path, ref, 0.99)


def test_k_quantizers():
    """The Q4_K and Q6_K writers: the decoder above is gguf-py's (bit for bit
    on tests/data/gguf's vectors), and it gives back each input within one
    quantization step of its block."""
    data = os.path.join(os.path.dirname(HERE), "data", "gguf")
    rng = np.random.default_rng(30)
    x = (rng.standard_normal((64, 512)) * 0.05).astype(np.float32)
    x[3, :256] = np.abs(x[3, :256])     # a block without negatives (min 0)
    x[5, 256:] = 0                      # an all-zero block
    result("K-quant writer input: not all equal", np.unique(x).size > 1000)
    for name, size, enc, dec in (("q4_k", 144, q4_k_bytes, q4_k_decode),
                                 ("q6_k", 210, q6_k_bytes, q6_k_decode)):
        with open(os.path.join(data, name + ".bin"), "rb") as f:
            raw = f.read()
        n = len(raw) // (size + 1024)
        want = np.frombuffer(raw[n * size:], dtype="<f4").reshape(n, 256)
        result("%s: the test's decoder gives gguf-py's floats for its %d blocks" % (name, n),
               n > 0 and dec(raw[:n * size]).tobytes() == want.tobytes())
        blob = enc(x)
        blk = x.reshape(-1, 256)
        y = dec(blob)
        if name == "q4_k":   # one step: the widest sub-block's range / 15
            sub = blk.reshape(-1, 8, 32)
            step = (sub.max(axis=2) - np.minimum(sub.min(axis=2), 0)).max(axis=1) / 15
        else:                # one step: the largest sub-block's amax / 31
            step = np.abs(blk.reshape(-1, 16, 16)).max(axis=2).max(axis=1) / 31
        err = np.abs(y - blk).max(axis=1)
        result("%s: the writer's %d blocks (%d bytes) decode within one step of the input "
               "(worst %.3f step)" % (name, len(blk), len(blob), float(np.max(err / np.maximum(
                   step, 1e-30)))),
               len(blob) == len(blk) * size and bool(np.all(err <= step)) and
               not np.any(y[11]), "")   # x[5, 256:] is block 11


def test_k_quants(shoal, tmp, tensors, kvs, ref):
    """Q4_K experts (gate and up; down has 192 columns, not a multiple of
    256, so Q8_0 as llama-quantize falls back for such rows), every other
    matrix Q6_K, token_embd and the router included."""
    path = os.path.join(tmp, "shakespeare-q4_k.gguf")
    t = [(n, x, "Q8_0" if "ffn_down_exps" in n else typ)
         for n, x, typ in typed(tensors, matrix_type="Q6_K", expert_type="Q4_K")]
    write_gguf(path, kvs, t)
    check_quantized(shoal, tmp, "q4_k-q6_k", path, ref, 0.98)


def test_decoders():
    """The decoders of the types written as random blocks give gguf-py's
    floats for tests/data/gguf's vectors."""
    for typ, (size, bs, dec, _) in RANDOM_TYPES.items():
        with open(os.path.join(DATA, typ.lower() + ".bin"), "rb") as f:
            raw = f.read()
        n = len(raw) // (size + 4 * bs)
        want = np.frombuffer(raw[n * size:], dtype="<f4").reshape(n, bs)
        got = dec(raw[:n * size])
        result("%s: the test's decoder gives gguf-py's floats for its %d blocks" % (typ, n),
               n > 0 and got.tobytes() == want.tobytes())


# Two files of random expert blocks, a type per layer: gate and up (256
# columns) of the 256-element types, down (192 columns) of the 32-element ones
MIXES = (("k-mix", ("Q5_K", "Q2_K", "Q3_K", "IQ4_XS"), ("IQ4_NL", "MXFP4")),
         ("iq-mix", ("IQ2_XXS", "IQ3_XXS", "IQ1_S", "IQ2_XXS"), ("MXFP4", "IQ4_NL")),
         ("iq-s-mix", ("IQ2_XS", "IQ2_S", "IQ3_S", "IQ2_S"), ("IQ4_NL", "MXFP4")))


def test_random_types(shoal, tmp, tensors, kvs):
    """Experts of random valid blocks of each new type (the rest BF16): the
    same bytes at --threads 1 and 2 and within cosine 0.9999 of a file with
    the same weights decoded to F32 by the test's own decoders."""
    rng = np.random.default_rng(301)
    for label, gate_up, down in MIXES:
        typed_t, ref_t = [], []
        for n, x, t in typed(tensors, matrix_type="BF16"):
            if "_exps." in n:
                il = int(n.split(".")[1])
                t = down[il % 2] if "ffn_down_exps" in n else gate_up[il % len(gate_up)]
                raw, y = random_blocks(t, x, rng)
                typed_t.append((n, (x, raw), t))
                ref_t.append((n, y, "F32"))
            else:
                typed_t.append((n, x, t))
                ref_t.append((n, x, t))
        path, ref_path = (os.path.join(tmp, "%s%s.gguf" % (label, s)) for s in ("", "-f32"))
        write_gguf(path, kvs, typed_t)
        write_gguf(ref_path, kvs, ref_t)
        r, ref = shoal_run(shoal, ref_path, os.path.join(tmp, label + "-f32.npy"))
        if not result("%s: the F32 file of the decoded weights runs" % label,
                      r.returncode == 0 and ref is not None, show(r)):
            continue
        # the same weights on both sides: only the int8 activations differ
        # (a correct run measures 1 - cos ~ 4e-6; one layer's IQ1_S delta
        # sign flipped gives 3.5e-4), so tighter than the 0.98 of issue 30
        check_quantized(shoal, tmp, "%s (%s experts)" % (label, ", ".join(gate_up + down)),
                        path, ref, 0.9999)


def test_bad_scales(shoal, tmp, tensors, kvs):
    """A non-finite f16 block scale: in a trunk matrix it is refused at load
    (exit 2); in an expert the first time the expert runs (scanning every
    expert at load would read every page of the file), a one-line error
    (exit 1, as any error found while generating). Layer 0's experts all
    run for these tokens (each of the 8 was tried)."""
    t = [(n, x, "Q8_0" if "ffn_down_exps" in n else typ)
         for n, x, typ in typed(tensors, matrix_type="Q6_K", expert_type="Q4_K")]
    gate_blocks = 192 * 1      # an expert's gate: 192 rows of one Q4_K block
    down_blocks = 256 * 6      # an expert's down: 256 rows of six Q8_0 blocks
    cases = [
        ("a NaN d in a Q6_K trunk matrix", {"blk.1.attn_k.weight": (5 * 210 + 208, 0x7E00)},
         2, ["blk.1.attn_k.weight", "Q6_K block 5 ", "d = nan"]),
        ("an infinite dmin in a Q4_K expert",
         {"blk.0.ffn_gate_exps.weight": ((3 * gate_blocks + 7) * 144 + 2, 0x7C00)},
         1, ["blk.0.ffn_gate_exps.weight", "Q4_K block %d " % (3 * gate_blocks + 7),
             "dmin = inf", "expert 3"]),
        ("a -inf d in a Q8_0 expert",
         {"blk.0.ffn_down_exps.weight": ((5 * down_blocks + 11) * 34, 0xFC00)},
         1, ["blk.0.ffn_down_exps.weight", "Q8_0 block %d " % (5 * down_blocks + 11),
             "d = -inf", "expert 5"]),
    ]
    for i, (name, poison, code, needles) in enumerate(cases):
        path = os.path.join(tmp, "bad-scale-%d.gguf" % i)
        write_gguf(path, kvs, t, poison=poison)
        r = H.run([shoal, "run", path] + ARGS, timeout=60)
        lines = (r.stderr or "").strip().splitlines()
        result("bad scale (%s): exit %d, one line naming %s" % (name, code, ", ".join(needles)),
               r.returncode == code and len(lines) == 1 and
               all(n in lines[0] for n in needles), show(r))


def vocab_kvs():
    """The bundled tokenizer.json (byte-level BPE) as tokenizer.ggml.* keys, as
    convert_hf_to_gguf.py writes a gpt2-style vocabulary."""
    with open(os.path.join(MODEL, "tokenizer.json")) as f:
        tj = json.load(f)
    vocab = tj["model"]["vocab"]
    added = {t["id"]: t["content"] for t in tj.get("added_tokens", [])}
    n = max(list(vocab.values()) + list(added.keys())) + 1
    toks = ["[PAD%d]" % i for i in range(n)]
    types = [1] * n
    for s, i in vocab.items():
        toks[i] = s
    for i, s in added.items():
        toks[i] = s
        types[i] = 3
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    return [kv("tokenizer.ggml.model", "str", "gpt2"), kv("tokenizer.ggml.pre", "str", "qwen2"),
            kv("tokenizer.ggml.tokens", ("arr", "str"), toks),
            kv("tokenizer.ggml.token_type", ("arr", "i32"), types),
            kv("tokenizer.ggml.merges", ("arr", "str"), merges)]


def test_vocab(shoal, tmp, tensors, kvs):
    path = os.path.join(tmp, "shakespeare-vocab.gguf")
    try:
        extra = vocab_kvs()
    except (KeyError, TypeError, ValueError) as e:
        result("vocab: the bundled tokenizer.json converts", False, repr(e))
        return
    write_gguf(path, kvs + extra, typed(tensors, "BF16"))
    args = ["--prompt", "ROMEO:", "--max-tokens", "12", "--greedy"]
    want = H.run([shoal, "run", MODEL] + args, timeout=120)
    got = H.run([shoal, "run", path] + args, timeout=120)
    result("vocab GGUF: --prompt gives the checkpoint's text (its own vocabulary)",
           got.returncode == 0 and want.returncode == 0 and got.stdout == want.stdout and
           got.stdout.strip(), "%s | got %r want %r" % (show(got), got.stdout, want.stdout))
    # a special id outside the vocabulary: a damaged file, said so (not "not set")
    for key, more in (("bos", [kv("tokenizer.ggml.add_bos_token", "bool", True)]), ("eos", [])):
        bad = os.path.join(tmp, "vocab-%s.gguf" % key)
        name = "tokenizer.ggml.%s_token_id" % key
        k2 = [k for k in kvs if not k.startswith(s_(name))] + [kv(name, "u32", 999999)] + more
        write_gguf(bad, k2 + extra, typed(tensors, "BF16"))
        r = H.run([shoal, "run", bad] + args, timeout=60)
        lines = (r.stderr or "").strip().splitlines()
        result("vocab GGUF: %s_token_id 999999 is out of range: exit 2, one line" % key,
               r.returncode == 2 and len(lines) == 1 and name + " is 999999" in lines[0] and
               "expected a token id 0 to" in lines[0], show(r))


def test_bad(shoal, tmp, tensors, cfg):
    base = typed(tensors, "BF16")
    q8_1 = [(n, x, "Q8_1" if n == "blk.2.ffn_down_exps.weight" else t) for n, x, t in base]
    wrong = [(n, x[:, :-32] if n == "blk.1.attn_k.weight" else x, t) for n, x, t in base]
    stray = base + [("blk.0.ffn_gate_shexp.weight", base[3][1], "BF16")]
    cases = [
        ("another architecture", metadata(cfg, arch="gemma3"), base, ["'gemma3'", "qwen3moe"]),
        ("a missing key", metadata(cfg, drop=("qwen3moe.expert_count",)), base,
         ["qwen3moe.expert_count", "missing"]),
        ("a key shoal does not read", metadata(cfg, extra=[
            ("qwen3moe.rope.scaling.type", "str", "yarn")]), base,
         ["qwen3moe.rope.scaling.type"]),
        ("a tensor type shoal does not run", metadata(cfg), q8_1,
         ["blk.2.ffn_down_exps.weight", "Q8_1", "not runnable"]),
        ("a wrong shape", metadata(cfg), wrong, ["blk.1.attn_k.weight", "shape"]),
        ("an unexpected tensor", metadata(cfg), stray, ["blk.0.ffn_gate_shexp.weight"]),
    ]
    for i, (name, kvs, t, needles) in enumerate(cases):
        path = os.path.join(tmp, "bad-%d.gguf" % i)
        write_gguf(path, kvs, t)
        r = H.run([shoal, "run", path] + ARGS, timeout=60)
        lines = (r.stderr or "").strip().splitlines()
        result("bad GGUF (%s): exit 2, one line naming %s" % (name, ", ".join(needles)),
               r.returncode == 2 and len(lines) == 1 and all(n in lines[0] for n in needles),
               show(r))
    path = os.path.join(tmp, "nope.gguf")
    r = H.run([shoal, "run", path] + ARGS, timeout=60)
    lines = (r.stderr or "").strip().splitlines()
    result("a .gguf path that does not exist: exit 2, one line naming it and GGUF files",
           r.returncode == 2 and len(lines) == 1 and path in lines[0] and
           "a GGUF file" in lines[0], show(r))


def checkpoint():
    """The bundled checkpoint: (its config, its safetensors, its tensors with
    llama.cpp's names, gguf_tensors)."""
    with open(os.path.join(MODEL, "config.json")) as f:
        cfg = json.load(f)
    st = read_safetensors(os.path.join(MODEL, "model.safetensors"))
    return cfg, st, gguf_tensors(st, cfg["num_hidden_layers"], cfg["num_experts"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    a = ap.parse_args()
    shoal = os.path.abspath(a.shoal)
    cfg, st, tensors = checkpoint()
    # every tensor of the decoder (the MTP layer, model.layers.L.*, is left out as
    # llama.cpp's qwen3moe converter leaves it)
    mtp = "model.layers.%d." % cfg["num_hidden_layers"]
    result("the writer's input: every checkpoint tensor mapped once",
           sum(1 for n in st if ".experts." not in n and not n.startswith(mtp)) +
           3 * cfg["num_hidden_layers"] == len(tensors) and
           all(np.any(x != 0) for _, x in tensors))
    test_k_quantizers()
    test_decoders()
    with tempfile.TemporaryDirectory(prefix="shoal-run-gguf-") as tmp:
        r, ref = shoal_run(shoal, MODEL, os.path.join(tmp, "ref.npy"))
        if not result("the checkpoint's own run", r.returncode == 0 and ref is not None,
                      show(r)):
            sys.exit(result.summary())
        kvs = metadata(cfg)
        test_exact(shoal, tmp, tensors, kvs, ref)
        test_q8_0(shoal, tmp, tensors, kvs, ref)
        test_k_quants(shoal, tmp, tensors, kvs, ref)
        test_random_types(shoal, tmp, tensors, kvs)
        test_bad_scales(shoal, tmp, tensors, kvs)
        test_vocab(shoal, tmp, tensors, kvs)
        test_bad(shoal, tmp, tensors, cfg)
    sys.exit(result.summary())


if __name__ == "__main__":
    main()
