#!/usr/bin/python3
"""Self-checks of the numpy reference itself (no engine needed).

usage: /usr/bin/python3 tests/reference/selftest_ref.py [--configs DIR]

RoPE / YaRN / llama3 / linear / dynamic numbers against values derived by hand
from the modeling_rope_utils formulas, the rotate_half pairing, RMSNorm, the
routing rules of each family (softmax -> top-k -> renormalise iff
norm_topk_prob; mixtral always), the qwen2_moe shared expert gate, GQA head
mapping, causality, per-head (qwen3) vs full-width (olmoe) q/k norm, clip_qkv,
the YaRN attention factor on cos *and* sin, BF16 decoding, and that the tiny
checkpoints route non-trivially. Ends with "N passed, M failed".
"""

import argparse
import math
import os
import struct
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # tests/: harness
import harness as H  # noqa: E402
sys.path.insert(0, HERE)
import gen_tiny  # noqa: E402
import ref_numpy as R  # noqa: E402

check = H.Results()   # check(name, cond, detail)


def close(a, b, tol=1e-12):
    return np.allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float), rtol=tol, atol=tol)


def rope_checks():
    base = dict(model_type="qwen3_moe", rope_theta=1e6, head_dim=16, max_position_embeddings=128)
    inv, af = R.rope_params(dict(base))
    check("rope default inv_freq = theta^(-2i/d)",
          close(inv, [1e6 ** (-(2 * i) / 16) for i in range(8)]) and af == 1.0)

    # YaRN of the tiny qwen3_moe_yarn: d=16, theta=1e6, original 32, factor 4, beta 32/1.
    # corr_dim(32) = 16*ln(32/(64 pi))/(2 ln 1e6) = -1.064 -> floor -> 0
    # corr_dim(1)  = 16*ln(32/(2 pi))/(2 ln 1e6) = 0.943 -> ceil -> 1
    # ramp(i) = clip(i, 0, 1): i=0 keeps the original frequency, i>=1 divides by 4.
    c = dict(base, rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32})
    inv, af = R.rope_params(c)
    want = [1.0] + [1.0 / (4.0 * 1e6 ** (2 * i / 16)) for i in range(1, 8)]
    check("yarn tiny inv_freq (low=0, high=1)", close(inv, want), f"inv[1]={inv[1]:.6f}")
    check("yarn attention_factor = 0.1 ln(4) + 1", abs(af - (0.1 * math.log(4) + 1)) < 1e-15, f"{af:.10f}")

    # DeepSeek-style YaRN: d=64, theta=1e4, factor 40, original 4096, mscale == mscale_all_dim
    # corr_dim(32) = 64 ln(4096/(64 pi)) / (2 ln 1e4) = 10.47 -> 10
    # corr_dim(1)  = 64 ln(4096/(2 pi))  / (2 ln 1e4) = 22.51 -> 23
    c = dict(model_type="mixtral", rope_theta=1e4, head_dim=64, max_position_embeddings=163840,
             rope_scaling={"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                           "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707})
    inv, af = R.rope_params(c)
    ok = True
    for i in range(32):
        ex = 1e4 ** (-(2 * i) / 64)
        ramp = min(max((i - 10) / 13, 0.0), 1.0)
        ok &= abs(inv[i] - (ex / 40 * ramp + ex * (1 - ramp))) < 1e-15
    check("yarn deepseek-style inv_freq (low=10, high=23)", ok, f"inv[16]={inv[16]:.6e}")
    check("yarn mscale == mscale_all_dim -> attention_factor 1", abs(af - 1.0) < 1e-15)
    c["rope_scaling"] = dict(c["rope_scaling"], mscale=1.0, mscale_all_dim=0.0)
    _, af = R.rope_params(c)
    check("yarn mscale_all_dim 0 -> default 0.1 ln(40) + 1", abs(af - (0.1 * math.log(40) + 1)) < 1e-15)
    c["rope_scaling"] = dict(c["rope_scaling"], attention_factor=0.5)
    _, af = R.rope_params(c)
    check("yarn explicit attention_factor wins", af == 0.5)

    # llama3: d=128, theta=5e5, factor 8, low 1, high 4, original 8192 (Llama-3.1 values)
    c = dict(model_type="mixtral", rope_theta=5e5, head_dim=128, max_position_embeddings=131072,
             rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    inv, af = R.rope_params(c)
    ok, kinds = True, set()
    for i in range(64):
        f = 5e5 ** (-(2 * i) / 128)
        wl = 2 * math.pi / f
        if wl < 8192 / 4:
            w, k = f, "high"
        elif wl > 8192 / 1:
            w, k = f / 8, "low"
        else:
            s = (8192 / wl - 1) / (4 - 1)
            w, k = (1 - s) * f / 8 + s * f, "mid"
        kinds.add(k)
        ok &= abs(inv[i] - w) <= 1e-15 * max(1.0, abs(w))
    check("llama3 inv_freq (high kept, low /8, mid smoothed)", ok and kinds == {"high", "low", "mid"})

    c = dict(base, rope_scaling={"type": "linear", "factor": 2.0})
    inv, _ = R.rope_params(c)
    check("linear inv_freq = default / factor", close(inv, [1e6 ** (-(2 * i) / 16) / 2 for i in range(8)]))

    c = dict(base, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    inv, _ = R.rope_params(c, seq_len=100)
    inv2, _ = R.rope_params(c, seq_len=256)
    b2 = 1e6 * ((2.0 * 256 / 128) - 1) ** (16 / 14)
    check("dynamic: default within max_position_embeddings, NTK base beyond",
          close(inv, [1e6 ** (-(2 * i) / 16) for i in range(8)]) and
          close(inv2, [b2 ** (-(2 * i) / 16) for i in range(8)]))

    # rotate_half pairing: dims (j, j + d/2) rotate together
    c = dict(model_type="mixtral", rope_theta=10000.0, head_dim=4, max_position_embeddings=16)
    cos, sin = R.rope_cos_sin(c, 4)
    q = np.array([1.0, 2.0, 3.0, 4.0])
    p = 3
    t0, t1 = p * 1.0, p * 10000 ** (-0.5)
    got = q * cos[p] + R.rotate_half(q) * sin[p]
    want = [1 * math.cos(t0) - 3 * math.sin(t0), 2 * math.cos(t1) - 4 * math.sin(t1),
            3 * math.cos(t0) + 1 * math.sin(t0), 4 * math.cos(t1) + 2 * math.sin(t1)]
    check("rope rotate_half pairs (j, j+d/2)", close(got, want))


def misc_checks():
    got = R.rms(np.array([3.0, 4.0]), np.array([1.0, 2.0]), 0.0)
    check("rmsnorm", close(got, [3 / math.sqrt(12.5), 8 / math.sqrt(12.5)]))
    got = R.rms(np.array([3.0, 4.0]), np.array([1.0, 1.0]), 0.5)
    check("rmsnorm eps inside the sqrt", close(got, [3 / math.sqrt(13.0), 4 / math.sqrt(13.0)]))
    # BF16 decode
    with tempfile.TemporaryDirectory() as td:
        p = os.path.join(td, "x.safetensors")
        h = b'{"t":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]}}'
        h += b" " * ((8 - len(h) % 8) % 8)
        with open(p, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + struct.pack("<3H", 0x3F80, 0xC000, 0x3EAA))
        t = R.read_safetensors(p)["t"]
        check("bf16 decode", close(t, [1.0, -2.0, struct.unpack("<f", struct.pack("<I", 0x3EAA0000))[0]]))


def routing_checks():
    """Replace every expert by 'return its id as a one-hot' to read the combine weights."""
    H, E, k = 6, 5, 2
    rng = np.random.default_rng(0)
    h = rng.standard_normal((3, H))
    gate = rng.standard_normal((E, H))
    saved = R.swiglu

    def onehot_expert(x, wg, wu, wd):
        return np.repeat(wd[:, :1].T, x.shape[0], axis=0)   # down_proj column 0 = one-hot id

    R.swiglu = onehot_expert
    try:
        for mt, norm in (("mixtral", False), ("qwen3_moe", True), ("olmoe", False), ("qwen2_moe", False)):
            W = {}
            if mt == "mixtral":
                p, names = "model.layers.0.block_sparse_moe.", ("w1", "w3", "w2")
            else:
                p, names = "model.layers.0.mlp.", ("gate_proj", "up_proj", "down_proj")
            W[p + "gate.weight"] = gate
            for e in range(E):
                for n in names:
                    W[p + f"experts.{e}.{n}.weight"] = np.eye(H)[:, [e]] if n == names[2] else np.zeros((1, H))
            if mt == "qwen2_moe":
                for n in names:
                    W[p + f"shared_expert.{n}.weight"] = np.eye(H)[:, [5]] if n == names[2] else np.zeros((1, H))
                W[p + "shared_expert_gate.weight"] = rng.standard_normal((1, H))
            c = dict(model_type=mt, num_experts_per_tok=k, top_k=k, n_experts=E, norm_topk_prob=norm,
                     decoder_sparse_step=1, mlp_only_layers=[])
            out = R.moe(R.Model(c, W), 0, h)
            for t in range(h.shape[0]):
                lg = gate @ h[t]
                pr = np.exp(lg - lg.max())
                pr /= pr.sum()
                top = np.argsort(-pr)[:k]
                w = np.zeros(H)
                w[top] = pr[top]
                if mt == "mixtral" or norm:
                    w[top] /= pr[top].sum()
                if mt == "qwen2_moe":
                    w[5] = 1 / (1 + math.exp(-(W[p + "shared_expert_gate.weight"] @ h[t])[0]))
                if not close(out[t], w):
                    check(f"routing weights {mt}", False, f"got {out[t]} want {w}")
                    break
            else:
                s = out[:, :E].sum(1)
                check(f"routing weights {mt} (softmax -> top-{k} -> "
                      f"{'renormalise' if (mt == 'mixtral' or norm) else 'no renorm'}"
                      f"{', + sigmoid-gated shared expert' if mt == 'qwen2_moe' else ''})", True,
                      f"sum of routed weights {s.min():.3f}..{s.max():.3f}")
        # mixtral ignores norm_topk_prob (always renormalises)
        c = dict(model_type="mixtral", top_k=k, n_experts=E, norm_topk_prob=False)
        W = {"model.layers.0.block_sparse_moe.gate.weight": gate}
        for e in range(E):
            W[f"model.layers.0.block_sparse_moe.experts.{e}.w2.weight"] = np.eye(H)[:, [e]]
            W[f"model.layers.0.block_sparse_moe.experts.{e}.w1.weight"] = np.zeros((1, H))
            W[f"model.layers.0.block_sparse_moe.experts.{e}.w3.weight"] = np.zeros((1, H))
        check("mixtral renormalises even with norm_topk_prob false",
              close(R.moe(R.Model(c, W), 0, h).sum(1), 1.0))
    finally:
        R.swiglu = saved


def model_checks(ck):
    ids = gen_tiny.PROMPT + [5, 9, 250]

    def logits(m, seq=ids):
        return R.forward_logits(m, seq)

    def mut(m, **cfg):
        m2 = R.Model(dict(m.c, **cfg), dict(m.W))
        return m2

    def rel(a, b):
        return float(np.abs(a - b).max() / np.abs(b).max())

    q3 = R.load_model(os.path.join(ck, "qwen3_moe"))
    base = logits(q3)
    # causality
    check("causal: prefix logits do not depend on later tokens",
          close(logits(q3, ids[:5]), base[:5], 1e-10))
    # per-head q/k norm: scaling one head's q rows (or one kv head's k rows) changes nothing
    m = mut(q3)
    a = "model.layers.0.self_attn."
    D = q3.c["head_dim"]
    m.W[a + "q_proj.weight"] = q3.W[a + "q_proj.weight"].copy()
    m.W[a + "q_proj.weight"][:D] *= 7.0
    m.W[a + "k_proj.weight"] = q3.W[a + "k_proj.weight"].copy()
    m.W[a + "k_proj.weight"][D:2 * D] *= 3.0
    check("qwen3 q_norm/k_norm are per head (head-wise rescale is a no-op)", rel(logits(m), base) < 1e-5,
          f"rel {rel(logits(m), base):.1e}")
    # GQA head mapping: expand kv heads to full MHA (head j uses kv head j // rep)
    nh, nkv = q3.c["num_attention_heads"], q3.c["num_key_value_heads"]
    rep = nh // nkv
    m = mut(q3, num_key_value_heads=nh)
    for i in range(q3.c["num_hidden_layers"]):
        a = f"model.layers.{i}.self_attn."
        for n in ("k_proj", "v_proj"):
            w = q3.W[a + n + ".weight"].reshape(nkv, D, -1)
            m.W[a + n + ".weight"] = np.repeat(w, rep, axis=0).reshape(nh * D, -1)
    check(f"GQA {nh}q/{nkv}kv == MHA with kv head j//{rep}", rel(logits(m), base) < 1e-12)
    # norm_topk_prob matters for qwen3
    check("qwen3: norm_topk_prob true vs false differ", rel(logits(mut(q3, norm_topk_prob=False)), base) > 1e-3)

    ol = R.load_model(os.path.join(ck, "olmoe"))
    ob = logits(ol)
    a = "model.layers.0.self_attn."
    m = mut(ol)
    m.W[a + "q_proj.weight"] = ol.W[a + "q_proj.weight"] * 7.0
    r_all = rel(logits(m), ob)
    m.W[a + "q_proj.weight"] = ol.W[a + "q_proj.weight"].copy()
    m.W[a + "q_proj.weight"][:ol.c["head_dim"]] *= 7.0
    r_one = rel(logits(m), ob)
    check("olmoe q_norm is full-width (global rescale no-op, one-head rescale not)",
          r_all < 1e-5 and r_one > 1e-3, f"global {r_all:.1e}, one head {r_one:.1e}")
    check("olmoe: norm_topk_prob false vs true differ", rel(logits(mut(ol, norm_topk_prob=True)), ob) > 1e-3)

    oc = R.load_model(os.path.join(ck, "olmoe_tied_clip"))
    check("olmoe_tied_clip: clip_qkv is active", rel(logits(mut(oc, clip_qkv=None)), logits(oc)) > 1e-3)
    check("olmoe_tied_clip: tied (no lm_head.weight)", "lm_head.weight" not in oc.W and oc.c["tie_word_embeddings"])

    qy = R.load_model(os.path.join(ck, "qwen3_moe_yarn"))
    yb = logits(qy)
    inv, af = R.rope_params(qy.c)
    m = mut(qy, rope_scaling=dict(qy.c["rope_scaling"], attention_factor=1.0))
    for i in range(qy.c["num_hidden_layers"]):
        a = f"model.layers.{i}.self_attn."
        m.W[a + "q_norm.weight"] = qy.W[a + "q_norm.weight"] * af
        m.W[a + "k_norm.weight"] = qy.W[a + "k_norm.weight"] * af
    check("yarn attention_factor multiplies cos and sin (== scaling q and k by it)",
          rel(logits(m), yb) < 1e-12, f"af={af:.6f}")
    check("yarn differs from default rope", rel(logits(mut(qy, rope_scaling=None)), yb) > 1e-3)

    qd = R.load_model(os.path.join(ck, "qwen3_moe_dense_layers"))
    pat = [R.is_moe_layer(qd.c, i) for i in range(qd.c["num_hidden_layers"])]
    check("decoder_sparse_step 2 + mlp_only_layers [3] -> MoE only in layer 1", pat == [False, True, False, False])

    q2 = R.load_model(os.path.join(ck, "qwen2_moe"))
    check("qwen2_moe has q/k/v biases (qkv_bias default) and a shared expert gate [1][hidden]",
          all(f"model.layers.0.self_attn.{x}_proj.bias" in q2.W for x in "qkv") and
          "model.layers.0.self_attn.o_proj.bias" not in q2.W and
          q2.W["model.layers.0.mlp.shared_expert_gate.weight"].shape == (1, q2.c["hidden_size"]))
    mx = R.load_model(os.path.join(ck, "mixtral"))
    check("mixtral loads from 2 shards + index", os.path.exists(os.path.join(ck, "mixtral", "model.safetensors.index.json"))
          and len(mx.W) == len(R.expected_tensors(mx.c)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default=gen_tiny.DEFAULT_CONFIGS)
    a = ap.parse_args()
    rope_checks()
    misc_checks()
    routing_checks()
    if os.path.isdir(a.configs):
        with tempfile.TemporaryDirectory(prefix="shoal-selftest-") as td:
            man, _ = gen_tiny.generate(td, a.configs, verbose=True)
            if all("ref_ids" in v for v in man["models"].values()):
                model_checks(td)
            else:
                check("tiny checkpoints generated", False, str(man["models"]))
    else:
        print("SKIP: ../shared/data/configs not found (model checks)")
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
