#!/usr/bin/python3
"""Independent numpy (float64) Qwen3-MoE forward over models/shakespeare-moe/,
reading only config.json, model.safetensors (bf16) and the golden files: no
code shared with the training script. Checks the golden logits (all 12 rows of
every prompt, feeding the recorded generated ids) and the held-out loss on the
first windows.

    /usr/bin/python3 models/verify_numpy.py [n_heldout_windows]   (default 4)
"""

import json
import math
import os
import struct
import sys

import numpy as np

D = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shakespeare-moe")


def load(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8:8 + n])
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "BF16"
        a, b = v["data_offsets"]
        u16 = np.frombuffer(raw[8 + n + a:8 + n + b], dtype="<u2")
        out[k] = (u16.astype(np.uint32) << 16).view(np.float32).reshape(v["shape"]).astype(np.float64)
    return out


def rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def forward(W, c, ids):
    T = len(ids)
    H, nh, nkv, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    E, K, eps = c["num_experts"], c["num_experts_per_tok"], c["rms_norm_eps"]
    inv = 1.0 / (c["rope_theta"] ** (np.arange(0, hd, 2) / hd))
    ang = np.arange(T)[:, None] * inv[None, :]
    cos = np.concatenate([np.cos(ang)] * 2, -1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, -1)[:, None, :]

    def rope(x):                                  # x [T, heads, hd]
        rot = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1)
        return x * cos + rot * sin

    x = W["model.embed_tokens.weight"][ids]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        h = rms(x, W[p + "input_layernorm.weight"], eps)
        q = (h @ W[p + "self_attn.q_proj.weight"].T).reshape(T, nh, hd)
        k = (h @ W[p + "self_attn.k_proj.weight"].T).reshape(T, nkv, hd)
        v = (h @ W[p + "self_attn.v_proj.weight"].T).reshape(T, nkv, hd)
        q = rope(rms(q, W[p + "self_attn.q_norm.weight"], eps))
        k = rope(rms(k, W[p + "self_attn.k_norm.weight"], eps))
        o = np.zeros((T, nh, hd))
        for hh in range(nh):
            kv = hh // (nh // nkv)
            s = q[:, hh] @ k[:, kv].T / math.sqrt(hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o[:, hh] = s @ v[:, kv]
        x = x + o.reshape(T, nh * hd) @ W[p + "self_attn.o_proj.weight"].T
        h = rms(x, W[p + "post_attention_layernorm.weight"], eps)
        logits = h @ W[p + "mlp.gate.weight"].T
        pr = np.exp(logits - logits.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        m = np.zeros_like(x)
        for t in range(T):
            top = np.argsort(-pr[t], kind="stable")[:K]
            w = pr[t, top]
            if c["norm_topk_prob"]:
                w = w / w.sum()
            for e, we in zip(top, w):
                q_ = p + "mlp.experts.%d." % e
                g = W[q_ + "gate_proj.weight"] @ h[t]
                u = W[q_ + "up_proj.weight"] @ h[t]
                m[t] += we * (W[q_ + "down_proj.weight"] @ (g / (1 + np.exp(-g)) * u))
        x = x + m
    x = rms(x, W["model.norm.weight"], eps)
    head = W["lm_head.weight"] if "lm_head.weight" in W else W["model.embed_tokens.weight"]
    return x @ head.T


def main():
    nwin = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    c = json.load(open(os.path.join(D, "config.json")))
    W = load(os.path.join(D, "model.safetensors"))
    g = json.load(open(os.path.join(D, "golden", "golden.json")))
    worst = 0.0
    for p in g["prompts"]:
        ref = np.load(os.path.join(D, "golden", p["logits_file"]))
        ids = p["prompt_ids"] + p["generated_ids"]
        lg = forward(W, c, ids)
        n0 = len(p["prompt_ids"])
        mine = lg[n0 - 1:n0 - 1 + len(p["generated_ids"])]
        err = np.abs(mine - ref).max()
        worst = max(worst, err)
        agree = (mine.argmax(-1) == np.array(p["generated_ids"])).all()
        print("%-14s max|dlogit| %.2e  greedy ids agree: %s" % (p["name"], err, agree))
        assert agree and err < 1e-3
    ho = json.load(open(os.path.join(D, "heldout.json")))
    import hashlib
    data = open(ho["corpus"], "rb").read()[ho["start"]:ho["start"] + ho["length"]]
    assert hashlib.sha256(data).hexdigest() == ho["sha256"]
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from check_tokenizer import load_tokenizer      # tokenizer from tokenizer.json
    ids = load_tokenizer(os.path.join(D, "tokenizer.json")).encode(data.decode("utf-8"))
    w = ho["window"]
    nll = []
    for i in range(nwin):
        win = ids[i * w:(i + 1) * w]
        lg = forward(W, c, win)[:-1]
        lg = lg - lg.max(-1, keepdims=True)
        lp = lg - np.log(np.exp(lg).sum(-1, keepdims=True))
        nll.extend(-lp[np.arange(w - 1), win[1:]])
    print("held-out first %d windows: loss %.6f (float64 numpy)" % (nwin, float(np.mean(nll))))
    print("OK (golden logits within %.2e)" % worst)


if __name__ == "__main__":
    main()
