#!/usr/bin/python3
"""Train a small Qwen3-MoE language model from scratch on tinyshakespeare and
write it as a standard Hugging Face checkpoint directory.

    /usr/bin/python3 models/train_shakespeare_moe.py            # full run
    /usr/bin/python3 models/train_shakespeare_moe.py --trial 30 # time 30 steps, write nothing
    /usr/bin/python3 models/train_shakespeare_moe.py --reuse-checkpoint
        # skip training if models/.work/ckpt.pt (from a full run with the same
        # settings) exists; redo export, evaluation, golden files, model card

Everything is deterministic: fixed seeds, a fixed step count, a seeded data
sampler, 2 torch threads and torch.use_deterministic_algorithms(True).

Output: models/shakespeare-moe/
    config.json  generation_config.json  model.safetensors (bf16)
    tokenizer.json  tokenizer_config.json  heldout.json  MODEL_CARD.md
    golden/golden.json  golden/<name>.logits.npy

Only the Python standard library, numpy and torch (Debian python3-torch 1.13)
are used: the byte-level BPE trainer/encoder, the safetensors writer/reader
and the Qwen3-MoE forward are written here, following the semantics of
Hugging Face tokenizers (ByteLevel + BPE) and transformers'
modeling_qwen3_moe.py.
"""

import argparse
import hashlib
import heapq
import json
import math
import os
import re
import struct
import sys
import time
import unicodedata
from collections import Counter, defaultdict

# Under CPU contention (this box is shared), OpenMP threads that spin at
# barriers make oneDNN 5-10x slower; passive waiting avoids that. Waiting
# policy does not change results.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CORPUS = "/work/shared/data/corpus/tinyshakespeare.txt"
OUT = os.path.join(HERE, "shakespeare-moe")
WORK = os.path.join(HERE, ".work")

SEED = 1234
THREADS = 2

# ---- tokenizer ------------------------------------------------------------
BPE_VOCAB = 3069                 # 256 byte tokens + 2813 merged tokens
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]   # ids 3069..3071

# ---- architecture (Hugging Face qwen3_moe) ---------------------------------
ARCH = dict(
    vocab_size=BPE_VOCAB + len(SPECIALS),   # 3072
    hidden_size=256,
    intermediate_size=768,       # dense-MLP width; unused (no mlp_only_layers)
    moe_intermediate_size=192,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=32,
    num_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    max_position_embeddings=256,
    router_aux_loss_coef=0.02,
    initializer_range=0.02,
)

# ---- training ---------------------------------------------------------------
STEPS = 1000
BATCH = 16                       # sequences per step
SEQ = ARCH["max_position_embeddings"]
LR = 2e-3
MIN_LR = 2e-4
WARMUP = 100
WEIGHT_DECAY = 0.1
BETAS = (0.9, 0.95)
GRAD_CLIP = 1.0
DROPOUT = 0.1                    # training only (residual branches); not part of the HF model
EVAL_EVERY = 200

GOLDEN_PROMPTS = [("romeo", "ROMEO:"),
                  ("first_citizen", "First Citizen:\n"),
                  ("king_henry", "KING HENRY")]
GOLDEN_NEW = 12


# =============================================================================
# Byte-level BPE (GPT-2 style, as Hugging Face tokenizers implements it)
# =============================================================================

def bytes_to_unicode():
    """GPT-2's reversible byte -> printable unicode character table."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
          + list(range(ord("\xae"), ord("\xff") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


B2U = bytes_to_unicode()
U2B = {u: b for b, u in B2U.items()}

# The ByteLevel pre-tokenizer regex (use_regex: true) is GPT-2's:
#   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
# Python's re has no \p{..}; build exact classes from unicodedata (L* / N*
# general categories) and the Unicode White_Space property (what \s means in
# the Rust/Oniguruma regex engines).
_WS = ("\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(chr(c) for c in range(0x2000, 0x200B))
       + "\u2028\u2029\u202f\u205f\u3000")


def _ranges(pred):
    out, start, prev = [], None, None
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            ok = False
        else:
            ok = pred(chr(cp))
        if ok and start is None:
            start = cp
        if not ok and start is not None:
            out.append((start, cp - 1))
            start = None
    if start is not None:
        out.append((start, 0x10FFFF))
    return "".join(re.escape(chr(a)) if a == b else re.escape(chr(a)) + "-" + re.escape(chr(b))
                   for a, b in out)


def build_pretok_regex():
    L = _ranges(lambda c: unicodedata.category(c).startswith("L"))
    N = _ranges(lambda c: unicodedata.category(c).startswith("N"))
    S = re.escape(_WS)
    pat = (r"'s|'t|'re|'ve|'m|'ll|'d"
           rf"| ?[{L}]+| ?[{N}]+| ?[^{S}{L}{N}]+|[{S}]+(?![^{S}])|[{S}]+")
    return re.compile(pat)


PRETOK = None


def pretokenize(text):
    global PRETOK
    if PRETOK is None:
        PRETOK = build_pretok_regex()
    return PRETOK.findall(text)


def train_bpe(text, vocab_size):
    """Standard BPE training over byte-level pre-tokens.

    Initial alphabet: all 256 bytes (id == byte value). Each step merges the
    most frequent adjacent pair (ties: smallest (left id, right id)), counting
    pairs inside pre-tokens only, weighted by pre-token frequency. Stops when
    the vocabulary has vocab_size entries. Returns (vocab list id->str,
    merges list of (str, str))."""
    words = Counter(pretokenize(text))
    vocab = [B2U[b] for b in range(256)]
    tok2id = {s: i for i, s in enumerate(vocab)}
    seqs, freqs = [], []
    for w in sorted(words):
        seqs.append(list(w.encode("utf-8")))
        freqs.append(words[w])
    pair_count = defaultdict(int)
    where = defaultdict(set)
    for wi, ids in enumerate(seqs):
        f = freqs[wi]
        for p in zip(ids, ids[1:]):
            pair_count[p] += f
            where[p].add(wi)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    merges = []
    while len(vocab) < vocab_size:
        if not heap:
            raise RuntimeError("BPE: ran out of pairs at vocab %d" % len(vocab))
        negc, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -negc or negc == 0:
            continue                             # stale heap entry
        a, b = pair
        new_str = vocab[a] + vocab[b]
        new_id = tok2id.get(new_str)
        if new_id is None:
            new_id = len(vocab)
            vocab.append(new_str)
            tok2id[new_str] = new_id
        merges.append((vocab[a], vocab[b]))
        touched = set()
        for wi in sorted(where.pop(pair)):
            ids = seqs[wi]
            f = freqs[wi]
            for p in zip(ids, ids[1:]):
                pair_count[p] -= f
                touched.add(p)
            new = []
            i = 0
            n = len(ids)
            while i < n:
                if i + 1 < n and ids[i] == a and ids[i + 1] == b:
                    new.append(new_id)
                    i += 2
                else:
                    new.append(ids[i])
                    i += 1
            seqs[wi] = new
            for p in zip(new, new[1:]):
                pair_count[p] += f
                where[p].add(wi)
                touched.add(p)
        pair_count.pop(pair, None)
        for p in touched:
            c = pair_count.get(p, 0)
            if c > 0:
                heapq.heappush(heap, (-c, p))
            elif p in pair_count:
                del pair_count[p]
    return vocab, merges


class Tokenizer:
    """Encoder/decoder for the tokenizer.json written by this script.

    encode: split out special tokens (only if parse_special), pre-tokenize
    with the GPT-2 regex, map each pre-token's UTF-8 bytes through
    bytes_to_unicode, then BPE: repeatedly merge the adjacent pair with the
    lowest merge rank (all its non-overlapping occurrences, left to right)."""

    def __init__(self, vocab, merges, specials):
        self.vocab = list(vocab) + list(specials)
        self.tok2id = {s: i for i, s in enumerate(self.vocab)}
        self.ranks = {tuple(m): r for r, m in enumerate(merges)}
        self.specials = list(specials)
        self.cache = {}

    def _bpe(self, word):
        syms = list(word)
        ranks = self.ranks
        while len(syms) > 1:
            best, best_rank = None, None
            for p in zip(syms, syms[1:]):
                r = ranks.get(p)
                if r is not None and (best_rank is None or r < best_rank):
                    best, best_rank = p, r
            if best is None:
                break
            a, b = best
            new = []
            i = 0
            while i < len(syms):
                if i + 1 < len(syms) and syms[i] == a and syms[i + 1] == b:
                    new.append(a + b)
                    i += 2
                else:
                    new.append(syms[i])
                    i += 1
            syms = new
        return [self.tok2id[s] for s in syms]

    def encode(self, text, parse_special=False):
        if parse_special:
            pat = "(" + "|".join(re.escape(s) for s in self.specials) + ")"
            out = []
            for part in re.split(pat, text):
                if part in self.specials:
                    out.append(self.tok2id[part])
                elif part:
                    out.extend(self.encode(part))
            return out
        out = []
        for w in pretokenize(text):
            ids = self.cache.get(w)
            if ids is None:
                ids = self._bpe("".join(B2U[b] for b in w.encode("utf-8")))
                self.cache[w] = ids
            out.extend(ids)
        return out

    def decode(self, ids):
        parts = []
        buf = bytearray()
        for i in ids:
            s = self.vocab[i]
            if s in self.specials:
                parts.append(buf.decode("utf-8", errors="replace"))
                buf = bytearray()
                parts.append(s)
            else:
                buf.extend(U2B[c] for c in s)
        parts.append(buf.decode("utf-8", errors="replace"))
        return "".join(parts)


def tokenizer_json(vocab, merges):
    n = len(vocab)
    added = [dict(id=n + i, content=s, single_word=False, lstrip=False, rstrip=False,
                  normalized=False, special=True) for i, s in enumerate(SPECIALS)]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                          "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True,
                           "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True,
                    "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {s: i for i, s in enumerate(vocab)},
            "merges": [a + " " + b for a, b in merges],
        },
    }


CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)


def tokenizer_config_json(n_bpe):
    dec = {}
    for i, s in enumerate(SPECIALS):
        dec[str(n_bpe + i)] = dict(content=s, lstrip=False, normalized=False, rstrip=False,
                                   single_word=False, special=True)
    return {
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": dec,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": "<|endoftext|>",
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>",
        "errors": "replace",
        "model_max_length": ARCH["max_position_embeddings"],
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


# =============================================================================
# Qwen3-MoE (follows transformers' modeling_qwen3_moe.py)
# =============================================================================

# Matrix-product precision/backend. Debian's torch 1.13 links the reference
# (netlib) BLAS: F.linear / bmm in float32 run at ~5 GFLOP/s here, while
# oneDNN (MKL-DNN) reaches ~100 GFLOP/s for float32 convolutions and far more
# for bf16 matmuls on this AVX512-BF16 CPU. So:
#   "bf16": training (mixed precision, like autocast): matmul inputs rounded to
#           bf16, fp32 accumulation and output; weights, optimizer state, norms,
#           softmax, RoPE and the loss stay float32.
#   "f32":  evaluation/golden/samples: float32 products written as 1x1
#           convolutions (oneDNN); mathematically the same as F.linear/matmul.
#   "ref":  plain float32 F.linear / torch.matmul (slow here; used to cross-check).
MM_MODE = "bf16"


def lin(x, w):
    """x [..., K] @ w[M, K]^T"""
    if MM_MODE == "bf16":
        return F.linear(x.to(torch.bfloat16), w.to(torch.bfloat16)).to(torch.float32)
    if MM_MODE == "ref":
        return F.linear(x, w)
    shp = x.shape
    x2 = x.reshape(-1, shp[-1])
    y = F.conv1d(x2.t().unsqueeze(0), w.unsqueeze(-1))[0].t()
    return y.reshape(*shp[:-1], w.shape[0])


def bmm_nt(a, b):
    """a [G, T, D], b [G, S, D] -> a @ b^T [G, T, S]"""
    if MM_MODE == "bf16":
        return torch.matmul(a.to(torch.bfloat16), b.to(torch.bfloat16).transpose(-1, -2)).to(torch.float32)
    if MM_MODE == "ref":
        return torch.matmul(a, b.transpose(-1, -2))
    G, T, D = a.shape
    S = b.shape[1]
    # grouped conv: input b^T [1, G*D, S], weight a [G*T, D, 1] -> [1, G*T, S]
    return F.conv1d(b.transpose(1, 2).reshape(1, G * D, S), a.reshape(G * T, D, 1), groups=G).view(G, T, S)


def bmm_nn(p, v):
    """p [G, T, S], v [G, S, D] -> p @ v [G, T, D]"""
    if MM_MODE == "bf16":
        return torch.matmul(p.to(torch.bfloat16), v.to(torch.bfloat16)).to(torch.float32)
    if MM_MODE == "ref":
        return torch.matmul(p, v)
    G, T, S = p.shape
    D = v.shape[2]
    # grouped conv: input v [1, G*S, D], weight p [G*T, S, 1] -> [1, G*T, D]
    return F.conv1d(v.reshape(1, G * S, D), p.reshape(G * T, S, 1), groups=G).view(G, T, D)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope_cos_sin(T, head_dim, theta):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    pos = torch.arange(T, dtype=torch.float32)
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, hd = c["hidden_size"], c["head_dim"]
        self.nh, self.nkv, self.hd = c["num_attention_heads"], c["num_key_value_heads"], hd
        self.q_proj = nn.Linear(H, self.nh * hd, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * hd, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * hd, bias=False)
        self.o_proj = nn.Linear(self.nh * hd, H, bias=False)
        self.q_norm = RMSNorm(hd, c["rms_norm_eps"])
        self.k_norm = RMSNorm(hd, c["rms_norm_eps"])

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_norm(lin(x, self.q_proj.weight).view(B, T, self.nh, self.hd)).transpose(1, 2)
        k = self.k_norm(lin(x, self.k_proj.weight).view(B, T, self.nkv, self.hd)).transpose(1, 2)
        v = lin(x, self.v_proj.weight).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.nh // self.nkv      # HF repeat_kv: query head h uses kv head h // rep
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        G = B * self.nh
        s = bmm_nt(q.reshape(G, T, self.hd), k.reshape(G, T, self.hd)).view(B, self.nh, T, T)
        s = s * (1.0 / math.sqrt(self.hd))
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        s = s.masked_fill(mask, float("-inf"))
        p = F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
        o = bmm_nn(p.reshape(G, T, T), v.reshape(G, T, self.hd)).view(B, self.nh, T, self.hd)
        o = o.transpose(1, 2).reshape(B, T, self.nh * self.hd)
        return lin(o, self.o_proj.weight)


class SparseMoE(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, I, E = c["hidden_size"], c["moe_intermediate_size"], c["num_experts"]
        self.E, self.k, self.norm_topk = E, c["num_experts_per_tok"], c["norm_topk_prob"]
        self.gate = nn.Linear(H, E, bias=False)
        # experts stacked: w_gate/w_up [E, I, H], w_down [E, H, I] (HF Linear layout per expert)
        self.w_gate = nn.Parameter(torch.empty(E, I, H))
        self.w_up = nn.Parameter(torch.empty(E, I, H))
        self.w_down = nn.Parameter(torch.empty(E, H, I))

    def forward(self, x):
        B, T, H = x.shape
        x = x.reshape(-1, H)
        logits = lin(x, self.gate.weight)
        probs = F.softmax(logits, dim=1, dtype=torch.float32)
        w, sel = torch.topk(probs, self.k, dim=-1)
        if self.norm_topk:
            w = w / w.sum(dim=-1, keepdim=True)
        w = w.to(x.dtype)
        out = torch.zeros_like(x)
        for e in range(self.E):
            tok, slot = torch.nonzero(sel == e, as_tuple=True)
            if tok.numel() == 0:
                continue
            xe = x[tok]
            ye = lin(F.silu(lin(xe, self.w_gate[e])) * lin(xe, self.w_up[e]), self.w_down[e])
            out.index_add_(0, tok, ye * w[tok, slot, None])
        return out.view(B, T, H), logits


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = SparseMoE(c)

    def forward(self, x, cos, sin, drop):
        x = x + F.dropout(self.self_attn(self.input_layernorm(x), cos, sin), drop, self.training)
        m, logits = self.mlp(self.post_attention_layernorm(x))
        x = x + F.dropout(m, drop, self.training)
        return x, logits


class Qwen3Moe(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([Layer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        # tied: lm_head.weight is embed_tokens.weight

    def init_weights(self, gen):
        std = self.c["initializer_range"]
        res_std = std / math.sqrt(2 * self.c["num_hidden_layers"])
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith("o_proj.weight") or name.endswith("w_down"):
                with torch.no_grad():
                    p.normal_(0.0, res_std, generator=gen)
            else:
                with torch.no_grad():
                    p.normal_(0.0, std, generator=gen)

    def forward(self, ids, drop=0.0):
        B, T = ids.shape
        cos, sin = rope_cos_sin(T, self.c["head_dim"], self.c["rope_theta"])
        x = self.embed_tokens(ids)
        router_logits = []
        for layer in self.layers:
            x, rl = layer(x, cos, sin, drop)
            router_logits.append(rl)
        x = self.norm(x)
        logits = lin(x, self.embed_tokens.weight)
        return logits, router_logits


def load_balancing_loss(router_logits, E, k):
    """HF load_balancing_loss_func (no attention mask): over all layers' tokens,
    E * sum_e (fraction of top-k slots routed to e, per slot rank) * (mean router prob of e)."""
    g = torch.cat(router_logits, dim=0)
    probs = F.softmax(g, dim=-1, dtype=torch.float32)
    _, sel = torch.topk(probs, k, dim=-1)
    mask = F.one_hot(sel, E).float()                   # [N, k, E]
    tokens_per_expert = mask.mean(dim=0)               # [k, E]
    prob_per_expert = probs.mean(dim=0)                # [E]
    return (tokens_per_expert * prob_per_expert.unsqueeze(0)).sum() * E


# ---- HF tensor names <-> module parameters -----------------------------------

def hf_state(model):
    """OrderedDict-like list of (hf_name, float32 tensor) in HF naming."""
    out = [("model.embed_tokens.weight", model.embed_tokens.weight)]
    for i, L in enumerate(model.layers):
        p = "model.layers.%d." % i
        out += [(p + "input_layernorm.weight", L.input_layernorm.weight),
                (p + "post_attention_layernorm.weight", L.post_attention_layernorm.weight),
                (p + "self_attn.q_proj.weight", L.self_attn.q_proj.weight),
                (p + "self_attn.k_proj.weight", L.self_attn.k_proj.weight),
                (p + "self_attn.v_proj.weight", L.self_attn.v_proj.weight),
                (p + "self_attn.o_proj.weight", L.self_attn.o_proj.weight),
                (p + "self_attn.q_norm.weight", L.self_attn.q_norm.weight),
                (p + "self_attn.k_norm.weight", L.self_attn.k_norm.weight),
                (p + "mlp.gate.weight", L.mlp.gate.weight)]
        for e in range(L.mlp.E):
            q = p + "mlp.experts.%d." % e
            out += [(q + "gate_proj.weight", L.mlp.w_gate[e]),
                    (q + "up_proj.weight", L.mlp.w_up[e]),
                    (q + "down_proj.weight", L.mlp.w_down[e])]
    out.append(("model.norm.weight", model.norm.weight))
    return [(n, t.detach().to(torch.float32).contiguous()) for n, t in out]


def load_hf_state(model, tensors):
    with torch.no_grad():
        model.embed_tokens.weight.copy_(tensors["model.embed_tokens.weight"])
        model.norm.weight.copy_(tensors["model.norm.weight"])
        for i, L in enumerate(model.layers):
            p = "model.layers.%d." % i
            L.input_layernorm.weight.copy_(tensors[p + "input_layernorm.weight"])
            L.post_attention_layernorm.weight.copy_(tensors[p + "post_attention_layernorm.weight"])
            for n in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"):
                getattr(L.self_attn, n).weight.copy_(tensors[p + "self_attn.%s.weight" % n])
            L.mlp.gate.weight.copy_(tensors[p + "mlp.gate.weight"])
            for e in range(L.mlp.E):
                q = p + "mlp.experts.%d." % e
                L.mlp.w_gate[e].copy_(tensors[q + "gate_proj.weight"])
                L.mlp.w_up[e].copy_(tensors[q + "up_proj.weight"])
                L.mlp.w_down[e].copy_(tensors[q + "down_proj.weight"])


# =============================================================================
# bf16 + safetensors
# =============================================================================

def f32_to_bf16_bits(a):
    """Round-to-nearest-even float32 -> bfloat16, returned as uint16 bits."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    if np.isnan(a).any():
        raise ValueError("NaN in weights")
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return r.astype(np.uint16)


def bf16_bits_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def write_safetensors(path, named_bits, metadata):
    """named_bits: list of (name, uint16 ndarray of bf16 bits)."""
    header = {"__metadata__": metadata}
    off = 0
    for name, arr in named_bits:
        nb = arr.size * 2
        header[name] = {"dtype": "BF16", "shape": list(arr.shape), "data_offsets": [off, off + nb]}
        off += nb
    hj = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hj += b" " * ((8 - len(hj) % 8) % 8)        # pad header to 8-byte alignment (as safetensors does)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for _, arr in named_bits:
            f.write(arr.astype("<u2").tobytes())


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (hl,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hl])
    base = 8 + hl
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "BF16", info
        a, b = info["data_offsets"]
        bits = np.frombuffer(raw[base + a:base + b], dtype="<u2")
        out[name] = torch.from_numpy(bf16_bits_to_f32(bits).reshape(info["shape"]).copy())
    return out, header


# =============================================================================
# data / evaluation
# =============================================================================

def adamw(module, lr=LR):
    """AdamW over module's parameters: weight decay on all but the norms."""
    decay, no_decay = [], []
    for n, p in module.named_parameters():
        (no_decay if n.endswith("norm.weight") else decay).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=BETAS, eps=1e-8)


def optimize(opt, module, loss):
    """One optimizer step on loss, gradients clipped to GRAD_CLIP; the norm before."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(module.parameters(), GRAD_CLIP)
    opt.step()
    return gn


def lr_at(step, warmup, total, lr=LR, min_lr=MIN_LR):
    """Linear warmup over warmup steps, then cosine from lr down to min_lr at total."""
    if step < warmup:
        return lr * (step + 1) / warmup
    pr = (step - warmup) / max(1, total - warmup)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * min(1.0, pr)))


def split_corpus(data):
    n = len(data)
    mark = (n * 9) // 10
    start = data.index(b"\n", mark) + 1   # first line start after the 90% mark
    return data[:start], data[start:], start


@torch.no_grad()
def heldout_eval(model, ids, window, batch=8, mode="f32"):
    global MM_MODE
    saved, MM_MODE = MM_MODE, mode
    try:
        return _heldout_eval(model, ids, window, batch)
    finally:
        MM_MODE = saved


def _heldout_eval(model, ids, window, batch):
    n_win = len(ids) // window
    arr = torch.tensor(ids[:n_win * window], dtype=torch.int64).view(n_win, window)
    tot = 0.0
    npred = 0
    for i in range(0, n_win, batch):
        x = arr[i:i + batch]
        logits, _ = model(x)
        lp = F.log_softmax(logits[:, :-1].float(), dim=-1)
        nll = -lp.gather(-1, x[:, 1:, None]).squeeze(-1)
        tot += float(nll.double().sum())
        npred += nll.numel()
    loss = tot / npred
    return loss, math.exp(loss), n_win, npred


@torch.no_grad()
def greedy(model, prompt_ids, n):
    ids = list(prompt_ids)
    rows = []
    for _ in range(n):
        logits, _ = model(torch.tensor([ids], dtype=torch.int64))
        row = logits[0, -1].float()
        rows.append(row.numpy().copy())
        ids.append(int(torch.argmax(row)))
    return ids[len(prompt_ids):], np.stack(rows).astype(np.float32)


@torch.no_grad()
def sample(model, prompt_ids, n, temperature, top_k, seed):
    g = torch.Generator().manual_seed(seed)
    ids = list(prompt_ids)
    W = model.c["max_position_embeddings"]
    for _ in range(n):
        logits, _ = model(torch.tensor([ids[-W:]], dtype=torch.int64))
        row = logits[0, -1].float() / temperature
        v, ix = torch.topk(row, top_k)
        p = F.softmax(v, dim=-1)
        ids.append(int(ix[torch.multinomial(p, 1, generator=g)]))
    return ids[len(prompt_ids):]


def router_usage(model, ids_batch, batch=16):
    """Fraction of top-k slots per expert, per layer, over ids_batch [n, T]."""
    model.eval()
    k, E = model.c["num_experts_per_tok"], model.c["num_experts"]
    cnt = torch.zeros(model.c["num_hidden_layers"], E, dtype=torch.float64)
    with torch.no_grad():
        for i in range(0, ids_batch.shape[0], batch):
            _, rls = model(ids_batch[i:i + batch])
            for l, rl in enumerate(rls):
                sel = torch.topk(rl, k, dim=-1).indices
                cnt[l] += torch.bincount(sel.flatten(), minlength=E).double()
    return [[round(float(x), 4) for x in row / row.sum()] for row in cnt]


# =============================================================================
# main
# =============================================================================

def log(*a):
    print(*a, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trial", type=int, default=0, help="time this many training steps, write nothing")
    ap.add_argument("--reuse-checkpoint", action="store_true")
    ap.add_argument("--debug-steps", type=int, default=0,
                    help="pipeline test only: train this many steps instead of STEPS (output is not the release)")
    args = ap.parse_args()
    if args.debug_steps:
        global STEPS, WARMUP
        STEPS, WARMUP = args.debug_steps, 1

    t_start = time.time()
    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(SEED)
    np.random.seed(SEED)

    data = open(CORPUS, "rb").read()
    train_b, held_b, held_start = split_corpus(data)
    train_text = train_b.decode("utf-8")
    held_text = held_b.decode("utf-8")
    held_sha = hashlib.sha256(held_b).hexdigest()
    log("corpus %d bytes sha256 %s; train [0,%d) held-out [%d,%d) %d bytes sha256 %s" % (
        len(data), hashlib.sha256(data).hexdigest(), held_start, held_start, len(data),
        len(held_b), held_sha))

    # ---- tokenizer
    t0 = time.time()
    vocab, merges = train_bpe(train_text, BPE_VOCAB)
    tok = Tokenizer(vocab, merges, SPECIALS)
    log("BPE trained: %d tokens, %d merges, %.1fs" % (len(vocab), len(merges), time.time() - t0))
    t0 = time.time()
    train_ids = tok.encode(train_text)
    held_ids = tok.encode(held_text)
    log("encoded: train %d tokens (%.2f bytes/token), held-out %d tokens, %.1fs" % (
        len(train_ids), len(train_b) / len(train_ids), len(held_ids), time.time() - t0))
    assert tok.decode(held_ids) == held_text, "tokenizer round-trip failed on held-out text"
    assert tok.decode(train_ids) == train_text, "tokenizer round-trip failed on train text"
    log("tokenizer round-trip OK (train and held-out)")

    c = dict(ARCH)
    model = Qwen3Moe(c)
    gen = torch.Generator().manual_seed(SEED)
    model.init_weights(gen)
    n_params = sum(p.numel() for p in model.parameters())
    per_expert = 3 * c["hidden_size"] * c["moe_intermediate_size"]
    n_active = n_params - c["num_hidden_layers"] * (c["num_experts"] - c["num_experts_per_tok"]) * per_expert
    log("parameters: %d total (tied embeddings), %d active per token" % (n_params, n_active))

    ckpt = os.path.join(WORK, "ckpt.pt")
    train_tensor = torch.tensor(train_ids, dtype=torch.int64)
    steps = args.trial if args.trial else STEPS
    final_train_loss = None
    train_wall = None
    history = []
    if args.reuse_checkpoint and os.path.exists(ckpt):
        st = torch.load(ckpt)
        assert st["steps"] == STEPS and st["arch"] == c
        model.load_state_dict(st["model"])
        final_train_loss, train_wall, history = st["final_train_loss"], st["train_wall"], st["history"]
        log("reused checkpoint %s" % ckpt)
    else:
        opt = adamw(model)
        rng = np.random.default_rng(SEED)
        n_starts = len(train_ids) - SEQ
        model.train()
        t_train = time.time()
        ema = None
        for step in range(steps):
            lr = lr_at(step, WARMUP, STEPS)
            for g_ in opt.param_groups:
                g_["lr"] = lr
            starts = torch.from_numpy(rng.integers(0, n_starts, size=BATCH))
            idx = starts[:, None] + torch.arange(SEQ)[None, :]
            x = train_tensor[idx]
            y = train_tensor[idx + 1]
            logits, rls = model(x, drop=DROPOUT)
            ce = F.cross_entropy(logits.reshape(-1, c["vocab_size"]), y.reshape(-1))
            # HF's formula applied to each layer separately, then averaged over layers
            # (HF concatenates all layers first, which only balances expert *indices*
            # summed over layers: a trial with it left expert 7 of layer 1 unused).
            aux = sum(load_balancing_loss([rl], c["num_experts"], c["num_experts_per_tok"])
                      for rl in rls) / len(rls)
            loss = ce + c["router_aux_loss_coef"] * aux
            gn = optimize(opt, model, loss)
            ce_v = float(ce)
            ema = ce_v if ema is None else 0.98 * ema + 0.02 * ce_v
            if step % 25 == 0 or step == steps - 1:
                el = time.time() - t_train
                sps = (step + 1) / el
                log("step %5d/%d  ce %.4f (ema %.4f)  aux %.4f  gnorm %.3f  lr %.2e  %.2f steps/s  eta %.0fs" % (
                    step, steps, ce_v, ema, float(aux), float(gn), lr, sps, (steps - step - 1) / sps))
            if not args.trial and ((step + 1) % EVAL_EVERY == 0 or step == steps - 1):
                model.eval()
                hl, hp, _, _ = heldout_eval(model, held_ids[:16 * SEQ], SEQ)
                model.train()
                history.append((step + 1, round(ema, 4), round(hl, 4)))
                log("  [eval] step %d train-ema %.4f held-out(first 16 windows, f32) %.4f ppl %.2f" % (
                    step + 1, ema, hl, hp))
        train_wall = time.time() - t_train
        final_train_loss = ema
        log("training: %d steps in %.1fs (%.3f s/step)" % (steps, train_wall, train_wall / steps))
        if args.trial:
            cs = sum(float(p.double().abs().sum()) for p in model.parameters())
            log("trial parameter checksum %r" % cs)
            return
        os.makedirs(WORK, exist_ok=True)
        torch.save({"steps": STEPS, "arch": c, "model": model.state_dict(),
                    "final_train_loss": final_train_loss, "train_wall": train_wall,
                    "history": history}, ckpt)

    # ---- export (bf16)
    os.makedirs(os.path.join(OUT, "golden"), exist_ok=True)
    named = hf_state(model)
    named_bits = []
    for n, t in named:
        bits = f32_to_bf16_bits(t.numpy())
        ref = t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        assert np.array_equal(bits, ref), "bf16 rounding disagrees with torch for " + n
        named_bits.append((n, bits))
    st_path = os.path.join(OUT, "model.safetensors")
    write_safetensors(st_path, named_bits, {"format": "pt"})

    config = {
        "architectures": ["Qwen3MoeForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": BPE_VOCAB,
        "decoder_sparse_step": 1,
        "eos_token_id": BPE_VOCAB,
        "head_dim": c["head_dim"],
        "hidden_act": "silu",
        "hidden_size": c["hidden_size"],
        "initializer_range": c["initializer_range"],
        "intermediate_size": c["intermediate_size"],
        "max_position_embeddings": c["max_position_embeddings"],
        "max_window_layers": c["num_hidden_layers"],
        "mlp_only_layers": [],
        "model_type": "qwen3_moe",
        "moe_intermediate_size": c["moe_intermediate_size"],
        "norm_topk_prob": c["norm_topk_prob"],
        "num_attention_heads": c["num_attention_heads"],
        "num_experts": c["num_experts"],
        "num_experts_per_tok": c["num_experts_per_tok"],
        "num_hidden_layers": c["num_hidden_layers"],
        "num_key_value_heads": c["num_key_value_heads"],
        "output_router_logits": False,
        "rms_norm_eps": c["rms_norm_eps"],
        "rope_scaling": None,
        "rope_theta": c["rope_theta"],
        "router_aux_loss_coef": c["router_aux_loss_coef"],
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": c["vocab_size"],
    }
    gen_config = {"bos_token_id": BPE_VOCAB, "eos_token_id": BPE_VOCAB, "do_sample": True,
                  "temperature": 0.8, "top_k": 40, "top_p": 1.0,
                  "transformers_version": "4.51.0"}

    def dump(obj, name):
        with open(os.path.join(OUT, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, ensure_ascii=False)
            f.write("\n")

    dump(config, "config.json")
    dump(gen_config, "generation_config.json")
    dump(tokenizer_config_json(len(vocab)), "tokenizer_config.json")
    with open(os.path.join(OUT, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_json(vocab, merges), f, ensure_ascii=False, separators=(",", ":"))

    # ---- reload everything from the written files and check
    tj = json.load(open(os.path.join(OUT, "tokenizer.json"), encoding="utf-8"))
    inv = sorted(tj["model"]["vocab"].items(), key=lambda kv: kv[1])
    tok2 = Tokenizer([s for s, _ in inv], [tuple(m.split(" ")) for m in tj["model"]["merges"]],
                     [t["content"] for t in tj["added_tokens"]])
    held_ids2 = tok2.encode(held_text)
    assert held_ids2 == held_ids and tok2.decode(held_ids2) == held_text
    log("tokenizer.json reloaded: encodes held-out identically and round-trips")

    global MM_MODE
    MM_MODE = "f32"      # everything after training is float32
    tensors, header = read_safetensors(st_path)
    emodel = Qwen3Moe(c)
    load_hf_state(emodel, tensors)
    emodel.eval()
    expected = {n for n, _ in named}
    assert set(tensors) == expected

    # ---- held-out evaluation with bf16-rounded weights, f32 compute
    t0 = time.time()
    loss, ppl, n_win, n_pred = heldout_eval(emodel, held_ids, SEQ)
    log("held-out (bf16 weights, f32 compute): loss %.5f ppl %.4f  windows %d predictions %d  %.1fs" % (
        loss, ppl, n_win, n_pred, time.time() - t0))
    tr_loss, tr_ppl, tr_win, _ = heldout_eval(emodel, train_ids[:64 * SEQ], SEQ)
    log("train split, first 64 windows, same protocol (bf16 weights): loss %.5f ppl %.4f" % (tr_loss, tr_ppl))
    l_f32 = heldout_eval(emodel, held_ids[:8 * SEQ], SEQ, mode="f32")[0]
    l_ref = heldout_eval(emodel, held_ids[:8 * SEQ], SEQ, mode="ref")[0]
    log("cross-check on the first 8 windows: oneDNN f32 %.6f vs plain F.linear/matmul f32 %.6f" % (l_f32, l_ref))
    assert abs(l_f32 - l_ref) < 1e-4
    heldout = {
        "corpus": CORPUS,
        "corpus_bytes": len(data),
        "corpus_sha256": hashlib.sha256(data).hexdigest(),
        "split_rule": "start = (index of first b'\\n' at or after floor(0.9*corpus_bytes)) + 1; held-out = bytes [start, end)",
        "start": held_start,
        "length": len(held_b),
        "sha256": held_sha,
        "n_tokens": len(held_ids),
        "bos": False,
        "window": SEQ,
        "n_windows": n_win,
        "n_predictions": n_pred,
        "loss": round(loss, 6),
        "perplexity": round(ppl, 6),
        "protocol": ("tokenize held-out text with tokenizer.json (no BOS, no special tokens); cut ids into "
                     "consecutive non-overlapping windows of exactly `window` tokens (drop the partial tail); "
                     "in each window predict tokens 1..window-1 from their prefix (positions restart at 0 "
                     "in every window); loss = mean natural-log NLL over all predictions; "
                     "perplexity = exp(loss); weights are the bf16 values of model.safetensors, computed in float32"),
    }
    dump(heldout, "heldout.json")

    # ---- golden files
    golden = {"weights": "model.safetensors (bf16) computed in float32", "bos": False,
              "n_generated": GOLDEN_NEW,
              "logits_layout": "float32 [n_generated][vocab_size]; row 0 = logits after the prompt, row i = logits after feeding generated token i-1",
              "prompts": []}
    for name, text in GOLDEN_PROMPTS:
        pids = tok.encode(text)
        gids, rows = greedy(emodel, pids, GOLDEN_NEW)
        np.save(os.path.join(OUT, "golden", name + ".logits.npy"), rows)
        golden["prompts"].append({"name": name, "prompt": text, "prompt_ids": pids,
                                  "prompt_tokens": [tok.vocab[i] for i in pids],
                                  "generated_ids": gids,
                                  "generated_text": tok.decode(gids),
                                  "logits_file": name + ".logits.npy"})
        log("golden %s: %r -> %s %r" % (name, text, gids, tok.decode(gids)))
    with open(os.path.join(OUT, "golden", "golden.json"), "w", encoding="utf-8") as f:
        json.dump(golden, f, indent=2, ensure_ascii=False)
        f.write("\n")

    # ---- samples
    g_prompt = tok.encode("ROMEO:\n")
    greedy_ids, _ = greedy(emodel, g_prompt, 120)
    greedy_text = "ROMEO:\n" + tok.decode(greedy_ids)
    s_prompt = tok.encode("First Citizen:\n")
    sampled_ids = sample(emodel, s_prompt, 200, temperature=0.8, top_k=40, seed=SEED)
    sampled_text = "First Citizen:\n" + tok.decode(sampled_ids)
    log("---- greedy ----\n" + greedy_text + "\n---- sampled ----\n" + sampled_text)

    usage = router_usage(emodel, torch.tensor(held_ids[:n_win * SEQ]).view(n_win, SEQ))
    log("expert usage per layer (held-out): %s" % usage)
    chat_example = ("<|im_start|>user\nSpeak, speak.<|im_end|>\n<|im_start|>assistant\n")

    # ---- model card
    wall_total = time.time() - t_start
    sizes = {}
    for root, _, files in os.walk(OUT):
        for fn in files:
            p = os.path.join(root, fn)
            sizes[os.path.relpath(p, OUT)] = os.path.getsize(p)
    card = make_card(c, n_params, n_active, held_start, held_b, held_sha, len(data), len(train_b),
                     len(train_ids), len(held_ids), loss, ppl, n_win, n_pred, final_train_loss,
                     train_wall, history, tr_loss, greedy_text, sampled_text, usage, golden, tok, chat_example)
    # card size estimate is included by writing twice (sizes table includes the card itself)
    for _ in range(2):
        with open(os.path.join(OUT, "MODEL_CARD.md"), "w", encoding="utf-8") as f:
            f.write(card(sizes))
        sizes["MODEL_CARD.md"] = os.path.getsize(os.path.join(OUT, "MODEL_CARD.md"))
    total = sum(sizes.values())
    log("files: " + ", ".join("%s %d" % kv for kv in sorted(sizes.items())))
    log("total %d bytes (%.2f MiB)" % (total, total / 2 ** 20))
    assert total <= 16 * 10 ** 6, "output directory exceeds 16 MB"
    log("total wall %.1fs" % wall_total)


def make_card(c, n_params, n_active, held_start, held_b, held_sha, n_data, n_train, n_train_tok,
              n_held_tok, loss, ppl, n_win, n_pred, final_train_loss, train_wall, history, tr_loss,
              greedy_text, sampled_text, usage, golden, tok, chat_example):
    def card(sizes):
        L = []
        A = L.append
        A("# shakespeare-moe\n")
        A("A tiny Qwen3-MoE (`model_type: qwen3_moe`) language model trained from scratch on "
          "tinyshakespeare, in standard Hugging Face checkpoint layout. It exists to test the shoal "
          "engine end to end (tokenizer, attention, routing, experts, bf16 weights) against a "
          "reference with known held-out perplexity and golden logits.\n")
        A("## How it was made\n")
        A("- Script: `models/train_shakespeare_moe.py`, run as `/usr/bin/python3 models/train_shakespeare_moe.py` "
          "(Debian python3-torch %s CPU, numpy %s, %d threads, `torch.use_deterministic_algorithms(True)`). "
          "Everything (tokenizer, model, safetensors writer) is implemented in that script; no "
          "`transformers`/`tokenizers`/`safetensors` packages were used." % (torch.__version__, np.__version__, THREADS))
        A("- Seed: %d (torch, numpy, data sampler `np.random.default_rng(%d)`, init generator)." % (SEED, SEED))
        A("- Corpus: `%s`, %d bytes, ASCII." % (CORPUS, n_data))
        A("- Split: held-out = bytes `[%d, %d)` (length %d, sha256 `%s`): start is one past the first "
          "`\\n` at or after floor(0.9 x %d). Train = bytes `[0, %d)`. The tokenizer and the model saw only "
          "the train split." % (held_start, n_data, len(held_b), held_sha, n_data, n_train))
        A("")
        A("## Tokenizer\n")
        A("- Byte-level BPE, GPT-2 style, trained by the script on the train split: 256 byte tokens "
          "(id = byte value; token text = GPT-2 `bytes_to_unicode` of the byte) + %d merges -> ids 0..%d; "
          "specials `<|endoftext|>` = %d, `<|im_start|>` = %d, `<|im_end|>` = %d (special: true). "
          "vocab_size = %d." % (BPE_VOCAB - 256, BPE_VOCAB - 1, BPE_VOCAB, BPE_VOCAB + 1, BPE_VOCAB + 2,
                                c["vocab_size"]))
        A("- Training: pre-tokenize with the GPT-2 regex, repeatedly merge the most frequent adjacent pair "
          "inside pre-tokens (ties -> smallest (left id, right id)).")
        A("- `tokenizer.json`: normalizer null; pre_tokenizer ByteLevel (add_prefix_space false, "
          "use_regex true: regex `'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+`"
          " then bytes_to_unicode); model BPE (merges as `\"a b\"` strings in rank order, byte_fallback false, "
          "no unk); decoder ByteLevel; post_processor ByteLevel (adds no tokens). Encoding is standard BPE: "
          "lowest merge rank first within each pre-token.")
        A("- No BOS is added (`add_bos_token: false`); bos = eos = pad = `<|endoftext|>` (%d). "
          "Train: %d tokens (%.2f bytes/token); held-out: %d tokens." % (
              BPE_VOCAB, n_train_tok, n_train / n_train_tok, n_held_tok))
        A("- Chat template (tokenizer_config.json, ChatML like Qwen; the model never saw chat data): "
          "`<|im_start|>{role}\\n{content}<|im_end|>\\n` per message, then `<|im_start|>assistant\\n` if "
          "add_generation_prompt; no default system message. Example: `%s` -> %s" % (
              chat_example.replace("\n", "\\n"), tok.encode(chat_example, parse_special=True)))
        A("- `decode(encode(x)) == x` is checked on the held-out and train text each run (also "
          "`models/check_tokenizer.py`).")
        A("")
        A("## Architecture (Hugging Face Qwen3-MoE)\n")
        A("| key | value |\n|---|---|")
        for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                  "head_dim", "num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
                  "rms_norm_eps", "rope_theta", "max_position_embeddings", "router_aux_loss_coef"):
            A("| %s | %s |" % (k, c[k]))
        A("| tie_word_embeddings | true (no lm_head.weight tensor) |")
        A("| dtype | bfloat16 (round-to-nearest-even from float32) |")
        A("")
        A("Every layer is MoE (decoder_sparse_step 1, mlp_only_layers []); no shared experts. "
          "`intermediate_size` (%d) is unused. Parameters: %d total, %d active per token." % (
              c["intermediate_size"], n_params, n_active))
        A("Forward (as transformers' modeling_qwen3_moe.py): pre-norm RMSNorm (float32, `x*rsqrt(mean(x^2)+eps)*w`); "
          "q/k per-head RMSNorm (q_norm/k_norm) before RoPE; RoPE rotate_half (first/second half pairs), "
          "inv_freq = 1/theta^(2i/head_dim); GQA with query head h using kv head h // 2; causal softmax with "
          "scale 1/sqrt(head_dim); router softmax over all experts (float32), top-2, renormalised; expert = "
          "down(silu(gate(x)) * up(x)); logits = norm(x) @ embed_tokens^T.")
        A("")
        A("## Training\n")
        A("- %d steps of AdamW (betas %s, eps 1e-8, weight decay %.2f on matrices/embeddings, none on norms), "
          "batch %d x %d tokens (random windows of the train split), grad-clip %.1f." % (
              STEPS, BETAS, WEIGHT_DECAY, BATCH, SEQ, GRAD_CLIP))
        A("- LR: linear warmup to %.1e over %d steps, cosine decay to %.1e at step %d." % (LR, WARMUP, MIN_LR, STEPS))
        A("- Loss: cross-entropy + %.3f x load-balancing aux loss: HF's `load_balancing_loss_func` formula "
          "(E x sum_e fraction-of-top-k-slots_e x mean-router-prob_e) computed per layer and averaged over "
          "layers. (HF applies it once to all layers' router logits concatenated; an earlier run of this "
          "script with that left one expert of layer 1 never selected.) "
          "Dropout %.2f on the attention and MoE residual branches during training only (not part of the "
          "inference model)." % (c["router_aux_loss_coef"], DROPOUT))
        A("- Precision: float32 master weights, AdamW state, norms, softmax, RoPE and loss; matrix products "
          "took bf16-rounded inputs with float32 accumulation and output (oneDNN; like bf16 autocast). "
          "Evaluation, golden files and samples use float32 products throughout (oneDNN 1x1 convolutions, "
          "checked against plain F.linear/matmul on 8 windows).")
        A("- Init: normal(0, %.2f); o_proj and expert down_proj normal(0, %.2f/sqrt(2*layers)); norms 1." % (
            c["initializer_range"], c["initializer_range"]))
        A("- Training wall time: %.0f s (%.2f s/step) on a shared 2-core machine." % (train_wall, train_wall / STEPS))
        A("- Final train loss: %.4f (EMA of the training cross-entropy, dropout on); %.4f on the first 64 "
          "windows of the train split with the held-out protocol below (bf16 weights, no dropout)." % (
              final_train_loss, tr_loss))
        A("- Progress (step, train EMA, held-out loss on its first 16 windows in float32):")
        for h in history:
            A("  - %d: %.4f, %.4f" % h)
        A("")
        A("## Held-out evaluation (bf16 weights, float32 compute)\n")
        A("Protocol: tokenize the held-out text (no BOS); cut into consecutive non-overlapping windows of "
          "exactly %d tokens, dropping the partial tail; within each window predict tokens 1..%d from their "
          "prefix (positions restart at 0 per window); loss = mean natural-log NLL; perplexity = exp(loss).\n" % (
              SEQ, SEQ - 1))
        A("- windows: %d, predictions: %d" % (n_win, n_pred))
        A("- **loss %.5f, perplexity %.4f**" % (loss, ppl))
        A("")
        A("Expert usage (fraction of top-2 slots over all held-out windows), per layer:\n")
        for i, u in enumerate(usage):
            A("- layer %d: %s" % (i, u))
        A("")
        A("## Golden files (`golden/`)\n")
        A("Greedy decoding of %d tokens (bf16 weights, float32 compute, no BOS); `<name>.logits.npy` is "
          "float32 [%d][%d], row 0 = logits after the prompt, row i = logits after feeding generated token i-1.\n" % (
              GOLDEN_NEW, GOLDEN_NEW, c["vocab_size"]))
        for p in golden["prompts"]:
            A("- `%s`: prompt %r -> ids %s (tokens %s); generated %s = %r" % (
                p["name"], p["prompt"], p["prompt_ids"], p["prompt_tokens"], p["generated_ids"], p["generated_text"]))
        A("")
        A("## Samples\n")
        A("Greedy, prompt `ROMEO:\\n`, 120 tokens:\n")
        A("```\n" + greedy_text + "\n```\n")
        A("Sampled, prompt `First Citizen:\\n`, 200 tokens, temperature 0.8, top-k 40, torch.Generator seed %d "
          "(context cropped to the last %d tokens):\n" % (SEED, SEQ))
        A("```\n" + sampled_text + "\n```\n")
        A("## Files\n")
        A("| file | bytes |\n|---|---|")
        for k, v in sorted(sizes.items()):
            A("| %s | %d |" % (k, v))
        A("| **total** | %d |" % sum(sizes.values()))
        A("")
        return "\n".join(L) + "\n"
    return card


if __name__ == "__main__":
    main()
