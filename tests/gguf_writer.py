"""A GGUF writer and a safetensors reader for the tests, with the stdlib
(struct) and Debian's numpy: GGUF v3 as gguf-py's GGUFWriter lays it out
(header, metadata pairs, tensor infos, data aligned to general.alignment,
32 by default); ne is the array's shape reversed, innermost first.

Used by tests/cli/test_run_gguf.py (qwen3moe, quantized types) and
tests/cli/test_gguf_arch.py (the other llama.cpp architectures)."""

import json
import struct

import numpy as np

GGML = {"F32": 0, "F16": 1, "Q5_0": 6, "Q8_0": 8, "Q8_1": 9, "Q4_K": 12, "Q6_K": 14, "BF16": 30,
        "MXFP4": 39}


def read_safetensors(path):
    """{name: float32 array} (BF16 widened exactly; U8, MXFP4's blocks and
    scales, as uint8)."""
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    out = {}
    for name, d in header.items():
        if name == "__metadata__":
            continue
        a, b = d["data_offsets"]
        raw = blob[8 + n + a:8 + n + b]
        if d["dtype"] == "BF16":
            u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            x = u.view(np.float32)
        elif d["dtype"] == "F32":
            x = np.frombuffer(raw, dtype="<f4").copy()
        elif d["dtype"] == "U8":
            x = np.frombuffer(raw, dtype=np.uint8).copy()
        else:
            raise SystemExit("unexpected dtype %s in %s" % (d["dtype"], path))
        out[name] = x.reshape(d["shape"])
    return out


def s_(x):
    x = x.encode()
    return struct.pack("<Q", len(x)) + x


def kv(key, typ, val):
    """One metadata pair; typ: u32, i32, f32, str, bool, or ("arr", elem) with
    elem str, i32 or bool."""
    out = s_(key)
    if typ == "u32":
        return out + struct.pack("<II", 4, val)
    if typ == "i32":
        return out + struct.pack("<Ii", 5, val)
    if typ == "f32":
        return out + struct.pack("<If", 6, val)
    if typ == "bool":
        return out + struct.pack("<IB", 7, 1 if val else 0)
    if typ == "str":
        return out + struct.pack("<I", 8) + s_(val)
    if typ == ("arr", "str"):
        return out + struct.pack("<IIQ", 9, 8, len(val)) + b"".join(s_(v) for v in val)
    if typ == ("arr", "i32"):
        return out + struct.pack("<IIQ", 9, 5, len(val)) + struct.pack("<%di" % len(val), *val)
    if typ == ("arr", "bool"):
        return out + struct.pack("<IIQ", 9, 7, len(val)) + bytes(1 if v else 0 for v in val)
    raise ValueError(typ)


def encode_float(x, typ):
    """x as F32, F16 or BF16 bytes (BF16: x must be BF16 values already)."""
    if typ == "F32":
        return np.ascontiguousarray(x, dtype="<f4").tobytes()
    if typ == "F16":
        return np.asarray(x, dtype=np.float32).astype("<f2").tobytes()
    if typ == "BF16":
        u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
        assert not np.any(u & 0xFFFF), "a value is not a BF16"
        return (u >> 16).astype("<u2").tobytes()
    raise ValueError(typ)


def q8_0_bytes(x):
    """ggml's quantize_row_q8_0_ref: per 32 values d = amax / 127 (stored as
    f16), q = roundf(x * (1 / d)) (half away from zero)."""
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, 32)
    amax = np.max(np.abs(x), axis=1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = x * inv[:, None]
    q = (np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))).astype(np.int8)
    blocks = np.zeros(len(x), dtype=[("d", "<f2"), ("q", "i1", 32)])
    blocks["d"] = d.astype("<f2")
    blocks["q"] = q
    return blocks.tobytes()


def write_gguf(path, kvs, tensors, align=32, poison=None, encode=encode_float):
    """tensors: [(name, array, ggml type name)], each encoded by
    encode(array, type) -> bytes (an array may also be a pair (array, its
    bytes as written), for encode to return). poison: {name: (byte offset in the
    tensor's data, u16)}, an f16 written over the encoded bytes there."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)))
    for k in kvs:
        out += k
    data = bytearray()
    for name, x, typ in tensors:
        ne = list(reversed((x[0] if isinstance(x, tuple) else x).shape))
        out += s_(name) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne)
        out += struct.pack("<IQ", GGML[typ], len(data))
        blob = bytearray(encode(x, typ))
        if poison and name in poison:
            off, h = poison[name]
            blob[off:off + 2] = struct.pack("<H", h)
        data += blob
        data += b"\0" * (-len(data) % align)
    out += b"\0" * (-len(out) % align)
    with open(path, "wb") as f:
        f.write(out + data)
