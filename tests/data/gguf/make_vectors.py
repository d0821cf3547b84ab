#!/usr/bin/env python3
"""Write the ggml dequantization test vectors of tests/unit/test_ggml_types.c.

The expected floats come from gguf-py's quants.py (llama.cpp's numpy
implementation of the formats), imported from the llama.cpp checkout given
with --gguf-py; nothing of it is copied here.

usage: make_vectors.py --gguf-py LLAMA_CPP/gguf-py [--out DIR] [--seed N]

For each type, DIR/<type>.bin holds n blocks of random bytes (n * type_size
bytes) followed by gguf-py's dequantization of them (n * block_size float32,
little-endian). Float fields (f16/bf16/f32 scales and values) are drawn
from all finite bit patterns (subnormals and zero included, inf/NaN
excluded); MXFP4 exponents from 0..254. IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS
and IQ3_S get extra blocks whose indices sweep the whole codebook (scale 1,
no signs), and DIR/grid_<type>.i8 holds gguf-py's codebook of those and
IQ1_S as int8 [entries][elements].
"""
import argparse
import os
import sys

import numpy as np

# name: (f16 offsets in the block, how many random blocks)
TYPES = {
    "F32": ([], 64), "F16": ([0], 64), "BF16": ([], 64),
    "Q4_0": ([0], 12), "Q4_1": ([0, 2], 12), "Q5_0": ([0], 12), "Q5_1": ([0, 2], 12),
    "Q8_0": ([0], 12), "Q2_K": ([80, 82], 6), "Q3_K": ([108], 6), "Q4_K": ([0, 2], 6),
    "Q5_K": ([0, 2], 6), "Q6_K": ([208], 6), "IQ4_NL": ([0], 12), "IQ4_XS": ([0], 6),
    "MXFP4": ([], 12), "IQ2_XXS": ([0], 6), "IQ3_XXS": ([0], 6), "IQ1_S": ([0], 6),
    "IQ1_M": ([], 6),
    # appended (issue 30's second IQ set), so the seeds of the ones above stay
    "IQ2_XS": ([0], 6), "IQ2_S": ([0], 6), "IQ3_S": ([0], 6),
}
# codebook entries; the small ones also get dequantized sweep blocks (IQ1_S's
# 2048 entries are checked by the test's own sweep against grid_iq1_s.i8)
GRIDS = {"IQ2_XXS": 256, "IQ3_XXS": 256, "IQ1_S": 2048,
         "IQ2_XS": 512, "IQ2_S": 1024, "IQ3_S": 512}
SWEEP = {"IQ2_XXS": 256, "IQ3_XXS": 256, "IQ2_XS": 512, "IQ2_S": 1024, "IQ3_S": 512}


def finite16(rng, n, mask=0x7C00, clear=0x4000, rot=0):
    """n random u16 whose exponent field is not all ones (finite f16/bf16);
    blocks 0..2 get the edge values -0, the smallest subnormal and 1.0,
    rotated by rot (so two fields of a block differ)."""
    v = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
    bad = (v & mask) == mask
    v[bad] &= np.uint16(0xFFFF ^ clear)
    edge = [0x8000, 0x0001, 0x3C00 if mask == 0x7C00 else 0x3F80]
    edge = edge[rot % 3:] + edge[:rot % 3]
    v[: min(n, len(edge))] = edge[: min(n, len(edge))]
    return v


def random_blocks(rng, name, type_size, f16_offs, n):
    b = rng.integers(0, 256, size=(n, type_size), dtype=np.uint16).astype(np.uint8)
    for k, off in enumerate(f16_offs):
        b[:, off:off + 2] = finite16(rng, n, rot=k).view(np.uint8).reshape(n, 2)
    if name == "F32":
        v = rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)
        bad = (v & 0x7F800000) == 0x7F800000
        v[bad] &= np.uint32(0xBFFFFFFF)
        b[:] = v.view(np.uint8).reshape(n, 4)
    if name == "BF16":
        b[:] = finite16(rng, n, 0x7F80, 0x4000).view(np.uint8).reshape(n, 2)
    if name == "MXFP4":
        b[:, 0] = rng.integers(0, 255, size=n)
        b[:2, 0] = [0, 1]                          # E8M0's subnormal halves
    if name == "IQ1_M":
        # the f16 scale is spread over the top nibbles of 4 u16 at 48..55
        d = finite16(rng, n)
        sc = b[:, 48:56].copy().view(np.uint16)
        for i in range(4):
            sc[:, i] = (sc[:, i] & 0x0FFF) | (((d >> (4 * i)) & 0xF) << 12)
        b[:, 48:56] = sc.view(np.uint8)
    return b


def blank(n, size):
    """n zero blocks of size bytes but for d = 1.0 (f16 at 0)"""
    b = np.zeros((n, size), np.uint8)
    b[:, 0:2] = np.array([0x3C00], np.uint16).view(np.uint8)
    return b


def sweep_blocks(name, entries):
    """Blocks with d = 1.0, scale 0, no signs, indices 0..entries-1."""
    if name == "IQ2_XXS":       # 8 groups: u32 of 4 index bytes, u32 signs/scale
        n = entries // 32
        b = blank(n, 66)
        idx = np.arange(entries).reshape(n, 8, 4)
        for g in range(8):
            b[:, 2 + 8 * g: 6 + 8 * g] = idx[:, g, :]
        return b
    if name == "IQ3_XXS":       # qs[64] indices, then 8 x u32 signs/scale
        n = entries // 64
        b = blank(n, 98)
        b[:, 2:66] = np.arange(entries).reshape(n, 64)
        return b
    if name == "IQ1_S":         # qs[32] low bits, qh[8] u16 (3 high bits each)
        n = entries // 32
        b = blank(n, 50)
        idx = np.arange(entries).reshape(n, 8, 4)
        b[:, 2:34] = (idx & 0xFF).reshape(n, 32)
        hi = idx >> 8
        qh = (hi[..., 0] | hi[..., 1] << 3 | hi[..., 2] << 6 | hi[..., 3] << 9).astype(np.uint16)
        b[:, 34:50] = qh.view(np.uint8).reshape(n, 16)
        return b
    if name == "IQ2_XS":        # qs[32] u16: 9-bit index, 7 sign bits (0)
        n = entries // 32
        b = blank(n, 74)
        b[:, 2:66] = np.arange(entries, dtype=np.uint16).reshape(n, 32).view(np.uint8)
        return b
    if name == "IQ2_S":         # qs[32] low 8 bits, signs[32], qh[8] (2 bits an index)
        n = entries // 32
        b = blank(n, 82)
        idx = np.arange(entries).reshape(n, 8, 4)
        b[:, 2:34] = (idx & 0xFF).reshape(n, 32)
        hi = idx >> 8
        b[:, 66:74] = hi[..., 0] | hi[..., 1] << 2 | hi[..., 2] << 4 | hi[..., 3] << 6
        return b
    if name == "IQ3_S":         # qs[64] low 8 bits, qh[8] (1 bit an index)
        n = entries // 64
        b = blank(n, 110)
        idx = np.arange(entries).reshape(n, 8, 8)
        b[:, 2:66] = (idx & 0xFF).reshape(n, 64)
        b[:, 66:74] = np.sum((idx >> 8) << np.arange(8), axis=2)
        return b
    raise ValueError(name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf-py", required=True, help="llama.cpp's gguf-py directory")
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--seed", type=int, default=30)
    a = ap.parse_args()
    sys.path.insert(0, a.gguf_py)
    from gguf import quants
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as Q

    for k, (name, (f16_offs, n)) in enumerate(TYPES.items()):
        qt = Q[name]
        block_size, type_size = GGML_QUANT_SIZES[qt]
        rng = np.random.default_rng(a.seed * 1000 + k)
        blocks = random_blocks(rng, name, type_size, f16_offs, n)
        if name in SWEEP:
            blocks = np.concatenate([blocks, sweep_blocks(name, SWEEP[name])])
        assert len(set(map(bytes, blocks))) == len(blocks), name   # no repeats
        y = quants.dequantize(blocks.reshape(-1), qt).astype(np.float32).reshape(-1)
        assert y.size == len(blocks) * block_size, name
        with open(os.path.join(a.out, name.lower() + ".bin"), "wb") as f:
            f.write(blocks.tobytes())
            f.write(y.astype("<f4").tobytes())
        print(f"{name}: {len(blocks)} blocks, {block_size} x {type_size} bytes")
    for name in GRIDS:
        cls = getattr(quants, name)
        cls.init_grid()
        g = cls.grid.reshape(cls.grid_shape)
        assert np.all(g == np.round(g)), name
        with open(os.path.join(a.out, "grid_" + name.lower() + ".i8"), "wb") as f:
            f.write(g.astype(np.int8).tobytes())
        print(f"grid {name}: {g.shape}")


if __name__ == "__main__":
    main()
