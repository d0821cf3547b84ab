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
  vocab:    the file's own vocabulary (tokenizer.ggml.*, from the bundled
            tokenizer.json) gives the checkpoint's text for --prompt
  bad:      another architecture, a missing key, a key shoal does not read,
            a tensor of a type shoal does not run, a wrong shape, an
            unexpected tensor: exit 2, one line naming what; --workers on a
            GGUF: exit 2
Ends with "N passed, M failed"; exit status 1 if anything failed.
"""

import argparse
import json
import os
import struct
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import harness as H  # noqa: E402

result = H.Results()
MODEL = H.MODEL
ARGS = ["--tokens", "1,2,3", "--max-tokens", "16", "--greedy"]

GGML = {"F32": 0, "F16": 1, "Q5_0": 6, "Q8_0": 8, "BF16": 30}


# ---- reading the checkpoint ------------------------------------------------

def read_safetensors(path):
    """{name: float32 array} (BF16 widened exactly)."""
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
        else:
            raise SystemExit("unexpected dtype %s in %s" % (d["dtype"], path))
        out[name] = x.reshape(d["shape"])
    return out


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

def s_(x):
    x = x.encode()
    return struct.pack("<Q", len(x)) + x


def kv(key, typ, val):
    """One metadata pair; typ: u32, i32, f32, str, bool, or ("arr", elem) with
    elem str or i32."""
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
    raise ValueError(typ)


def f16_bytes(x):
    return np.asarray(x, dtype=np.float32).astype("<f2").tobytes()


def bf16_bytes(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    # the checkpoint's values are BF16 already: the low half is zero, exact
    assert not np.any(u & 0xFFFF), "a value is not a BF16"
    return (u >> 16).astype("<u2").tobytes()


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


def encode(x, typ):
    if typ == "F32":
        return np.ascontiguousarray(x, dtype="<f4").tobytes()
    if typ == "F16":
        return f16_bytes(x)
    if typ == "BF16":
        return bf16_bytes(x)
    if typ == "Q8_0":
        return q8_0_bytes(x)
    if typ == "Q5_0":   # only its size matters (a type shoal refuses)
        return bytes(x.size // 32 * 22)
    raise ValueError(typ)


def write_gguf(path, kvs, tensors, align=32):
    """tensors: [(name, array, ggml type name)]; ne is the array's shape
    reversed (innermost first)."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)))
    for k in kvs:
        out += k
    data = bytearray()
    for name, x, typ in tensors:
        ne = list(reversed(x.shape))
        out += s_(name) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne)
        out += struct.pack("<IQ", GGML[typ], len(data))
        data += encode(x, typ)
        data += b"\0" * (-len(data) % align)
    out += b"\0" * (-len(out) % align)
    with open(path, "wb") as f:
        f.write(out + data)


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


def test_q8_0(shoal, tmp, tensors, kvs, ref):
    ref_tok = [int(np.argmax(x)) for x in ref]
    for label, kinds in (("q8_0", dict(matrix_type="BF16", expert_type="Q8_0")),
                         ("q8_0-all", dict(matrix_type="Q8_0"))):
        path = os.path.join(tmp, "shakespeare-%s.gguf" % label)
        write_gguf(path, kvs, typed(tensors, **kinds))
        r1, a = shoal_run(shoal, path, os.path.join(tmp, label + "-1.npy"), "--threads", "1")
        r2, b = shoal_run(shoal, path, os.path.join(tmp, label + "-2.npy"), "--threads", "2")
        result("%s GGUF: runs (16 greedy steps)" % label,
               r1.returncode == 0 and a is not None and a.shape == ref.shape, show(r1))
        if a is None or a.shape != ref.shape:
            continue
        result("%s GGUF: the same logits bytes at --threads 1 and 2" % label,
               same_bytes(a, b), show(r2))
        tok = [int(np.argmax(x)) for x in a]
        agree = 0
        while agree < len(tok) and tok[agree] == ref_tok[agree]:
            agree += 1
        # the steps up to the first differing token saw the same context
        cos = cosines(a[:agree + 1], ref[:agree + 1])
        result("%s GGUF: greedy tokens follow the BF16 run (%d of 16 agree), each such "
               "step's logits within cosine 0.99 (min %.5f)" % (label, agree, min(cos)),
               agree >= 4 and min(cos) > 0.99, "tokens %s vs %s" % (tok, ref_tok))
        result("%s GGUF: not the BF16 bytes (the quantized weights are used)" % label,
               a.tobytes() != ref.tobytes())


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


def test_bad(shoal, tmp, tensors, cfg):
    base = typed(tensors, "BF16")
    q5 = [(n, x, "Q5_0" if n == "blk.2.ffn_down_exps.weight" else t) for n, x, t in base]
    wrong = [(n, x[:, :-32] if n == "blk.1.attn_k.weight" else x, t) for n, x, t in base]
    stray = base + [("blk.0.ffn_gate_shexp.weight", base[3][1], "BF16")]
    cases = [
        ("another architecture", metadata(cfg, arch="llama"), base, ["'llama'", "qwen3moe"]),
        ("a missing key", metadata(cfg, drop=("qwen3moe.expert_count",)), base,
         ["qwen3moe.expert_count", "missing"]),
        ("a key shoal does not read", metadata(cfg, extra=[
            ("qwen3moe.rope.scaling.type", "str", "yarn")]), base,
         ["qwen3moe.rope.scaling.type"]),
        ("a tensor type shoal does not run", metadata(cfg), q5,
         ["blk.2.ffn_down_exps.weight", "Q5_0", "not runnable"]),
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
    path = os.path.join(tmp, "ok.gguf")
    write_gguf(path, metadata(cfg), base)
    r = H.run([shoal, "run", path, "--workers", "127.0.0.1:1"] + ARGS, timeout=60)
    lines = (r.stderr or "").strip().splitlines()
    result("--workers on a GGUF: exit 2, one line saying why",
           r.returncode == 2 and len(lines) == 1 and "GGUF" in lines[0] and
           "--workers" in lines[0], show(r))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    a = ap.parse_args()
    shoal = os.path.abspath(a.shoal)
    with open(os.path.join(MODEL, "config.json")) as f:
        cfg = json.load(f)
    st = read_safetensors(os.path.join(MODEL, "model.safetensors"))
    tensors = gguf_tensors(st, cfg["num_hidden_layers"], cfg["num_experts"])
    result("the writer's input: every checkpoint tensor mapped once",
           sum(1 for n in st if ".experts." not in n) + 3 * cfg["num_hidden_layers"] ==
           len(tensors) and all(np.any(x != 0) for _, x in tensors))
    with tempfile.TemporaryDirectory(prefix="shoal-run-gguf-") as tmp:
        r, ref = shoal_run(shoal, MODEL, os.path.join(tmp, "ref.npy"))
        if not result("the checkpoint's own run", r.returncode == 0 and ref is not None,
                      show(r)):
            sys.exit(result.summary())
        kvs = metadata(cfg)
        test_exact(shoal, tmp, tensors, kvs, ref)
        test_q8_0(shoal, tmp, tensors, kvs, ref)
        test_vocab(shoal, tmp, tensors, kvs)
        test_bad(shoal, tmp, tensors, cfg)
    sys.exit(result.summary())


if __name__ == "__main__":
    main()
