"""A random-weight qwen3_moe checkpoint, its tokenizer, and the same weights as
GGUF: what bench/vs_llamacpp.py gives both engines (docs/BENCHMARKS.md,
"vs llama.cpp").

  Shape, ISSUE_SHAPE   the model's shape (the issue-13 table: Qwen3-30B-A3B's
                       layer with 12 layers and a 32000-token vocabulary)
  train_tokenizer      a byte-level BPE (Qwen2 pre-tokenizer) -> tokenizer.json
  write_hf_model       config.json, generation_config.json, model.safetensors
                       (BF16, weights ~ N(0, 0.02), norms 1)
  write_gguf           Hugging Face directory -> qwen3moe GGUF, with llama.cpp's
                       own gguf-py package (passed in as a module: the caller
                       finds it in a llama.cpp tree; nothing of llama.cpp is here)
  param_counts         parameters of the experts and of the rest

Only the standard library and numpy (Debian's python3-numpy).
"""
import collections
import heapq
import json
import os
import re
import struct
import time

import numpy as np


class Shape:
    """A qwen3_moe shape. Every routed layer has n_expert experts of expert_ff
    rows; attention is GQA with q/k RMS norms (head_dim per head)."""

    def __init__(self, layers=12, hidden=2048, heads=32, kv_heads=4, head_dim=128,
                 experts=128, expert_ff=768, top_k=8, vocab=32000):
        self.layers, self.hidden, self.heads, self.kv_heads = layers, hidden, heads, kv_heads
        self.head_dim, self.experts, self.expert_ff, self.top_k = head_dim, experts, expert_ff, top_k
        self.vocab = vocab

    def as_dict(self):
        return dict(vars(self))


def ISSUE_SHAPE(layers=12):
    """The shape measured in issue 13 (7.6 B parameters at 12 layers)."""
    return Shape(layers=layers)


def tensors(s):
    """(name, shape, 'rand'|'ones') of every tensor, in file order."""
    H, HD = s.hidden, s.head_dim
    yield "model.embed_tokens.weight", (s.vocab, H), "rand"
    for layer in range(s.layers):
        p = "model.layers.%d." % layer
        yield p + "input_layernorm.weight", (H,), "ones"
        yield p + "self_attn.q_proj.weight", (s.heads * HD, H), "rand"
        yield p + "self_attn.k_proj.weight", (s.kv_heads * HD, H), "rand"
        yield p + "self_attn.v_proj.weight", (s.kv_heads * HD, H), "rand"
        yield p + "self_attn.o_proj.weight", (H, s.heads * HD), "rand"
        yield p + "self_attn.q_norm.weight", (HD,), "ones"
        yield p + "self_attn.k_norm.weight", (HD,), "ones"
        yield p + "post_attention_layernorm.weight", (H,), "ones"
        yield p + "mlp.gate.weight", (s.experts, H), "rand"
        for e in range(s.experts):
            q = "%smlp.experts.%d." % (p, e)
            yield q + "gate_proj.weight", (s.expert_ff, H), "rand"
            yield q + "up_proj.weight", (s.expert_ff, H), "rand"
            yield q + "down_proj.weight", (H, s.expert_ff), "rand"
    yield "model.norm.weight", (H,), "ones"
    yield "lm_head.weight", (s.vocab, H), "rand"


def param_counts(s):
    """{'experts': routed expert weights, 'dense': everything else, 'total'}."""
    ex = s.layers * s.experts * 3 * s.hidden * s.expert_ff
    total = sum(int(np.prod(shape)) for _, shape, _ in tensors(s))
    return {"experts": ex, "dense": total - ex, "total": total}


# ---- tokenizer -----------------------------------------------------------------------

# Qwen2's pre-tokenizer regex (what tokenizer.json carries), and an approximation
# for Python's re, used only to split the training text.
QWEN2_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
             r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PY_PAT = re.compile(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\w]?[^\W\d_]+|\d"
                    r"| ?[^\s\w]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def bytes_to_unicode():
    """GPT-2's byte -> printable character table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def _learn_merges(words, target):
    """Greedy BPE on words = [[symbols], freq] (modified in place): up to target merges."""
    pair_count = collections.Counter()
    pair_where = collections.defaultdict(set)
    for i, (sym, f) in enumerate(words):
        for a, b in zip(sym, sym[1:]):
            pair_count[(a, b)] += f
            pair_where[(a, b)].add(i)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    merges = []
    while len(merges) < target and heap:
        negc, p = heapq.heappop(heap)
        c = pair_count.get(p, 0)
        if c <= 0:
            continue
        if -negc != c:          # stale entry
            heapq.heappush(heap, (-c, p))
            continue
        merges.append(p)
        new = p[0] + p[1]
        touched = set()
        for i in list(pair_where[p]):
            sym, f = words[i]
            for a, b in zip(sym, sym[1:]):
                pair_count[(a, b)] -= f
                touched.add((a, b))
            j, out = 0, []
            while j < len(sym):
                if j + 1 < len(sym) and sym[j] == p[0] and sym[j + 1] == p[1]:
                    out.append(new)
                    j += 2
                else:
                    out.append(sym[j])
                    j += 1
            words[i][0] = out
            for a, b in zip(out, out[1:]):
                pair_count[(a, b)] += f
                pair_where[(a, b)].add(i)
                touched.add((a, b))
        del pair_count[p]
        pair_where.pop(p, None)
        for q in touched:
            if pair_count.get(q, 0) > 0:
                heapq.heappush(heap, (-pair_count[q], q))
    return merges


def train_tokenizer(out_dir, vocab_size, text):
    """Train a byte-level BPE on text (str) and write out_dir/tokenizer.json and
    tokenizer_config.json. The vocabulary is 256 byte tokens + merges + the 3
    SPECIALS, vocab_size in all when the text allows that many merges (fewer
    otherwise; the model's vocab_size pads). Returns {'vocab', 'merges',
    'endoftext'} (endoftext: the id of <|endoftext|>)."""
    b2u = bytes_to_unicode()
    counts = collections.Counter(PY_PAT.findall(text))
    words = [[[b2u[b] for b in w.encode("utf-8")], f] for w, f in counts.items()]
    merges = _learn_merges(words, vocab_size - 256 - len(SPECIALS))
    vocab = {}
    for b in range(256):
        vocab[b2u[b]] = len(vocab)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    added = []
    for s in SPECIALS:
        added.append({"id": len(vocab), "content": s, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True})
        vocab[s] = len(vocab)
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                  "use_regex": False}
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_PAT}, "behavior": "Isolated", "invert": False},
            byte_level]},
        "post_processor": byte_level, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": [[a, b] for a, b in merges]},
    }
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    cfg = {
        "add_bos_token": False, "add_eos_token": False, "add_prefix_space": False,
        "added_tokens_decoder": {str(a["id"]): {k: a[k] for k in a if k != "id"} for a in added},
        "additional_special_tokens": SPECIALS[1:],
        "bos_token": None, "eos_token": SPECIALS[0], "pad_token": SPECIALS[0],
        "clean_up_tokenization_spaces": False, "errors": "replace", "model_max_length": 40960,
        "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
        "chat_template": "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + "
                         "message['content'] + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}"
                         "{{- '<|im_start|>assistant\\n' }}{%- endif %}",
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)
    return {"vocab": len(vocab), "merges": len(merges), "endoftext": vocab[SPECIALS[0]]}


# ---- the checkpoint ----------------------------------------------------------------------


def to_bf16(x):
    """f32 array -> uint16 bfloat16 bits, round to nearest even."""
    u = x.view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)


def write_hf_model(out_dir, s, seed, eot, progress=None):
    """Write config.json, generation_config.json and model.safetensors (BF16) of
    shape s into out_dir; eot is the <|endoftext|> id (bos and eos). Weights are
    N(0, 0.02) from numpy's default_rng(seed), norm weights 1. Streams in chunks
    of 8 M values (memory stays under ~0.2 GB); model.safetensors appears only
    when complete. progress(msg) is called now and then. Returns its bytes."""
    os.makedirs(out_dir, exist_ok=True)
    cfg = {
        "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": eot, "decoder_sparse_step": 1, "eos_token_id": eot, "head_dim": s.head_dim,
        "hidden_act": "silu", "hidden_size": s.hidden, "initializer_range": 0.02,
        "intermediate_size": 8 * s.expert_ff, "max_position_embeddings": 40960,
        "max_window_layers": s.layers, "mlp_only_layers": [], "model_type": "qwen3_moe",
        "moe_intermediate_size": s.expert_ff, "norm_topk_prob": True,
        "num_attention_heads": s.heads, "num_experts": s.experts, "num_experts_per_tok": s.top_k,
        "num_hidden_layers": s.layers, "num_key_value_heads": s.kv_heads,
        "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_scaling": None,
        "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
        "use_cache": True, "use_sliding_window": False, "vocab_size": s.vocab,
    }
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": eot, "eos_token_id": eot, "do_sample": False}, f, indent=2)
    specs = list(tensors(s))
    header, off = {}, 0
    for name, shape, _ in specs:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    header["__metadata__"] = {"format": "pt"}
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    rng = np.random.default_rng(seed)
    path = os.path.join(out_dir, "model.safetensors")
    t0 = time.time()
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        done = 0
        for i, (name, shape, kind) in enumerate(specs):
            n = int(np.prod(shape))
            if kind == "ones":
                f.write(np.full(n, 0x3F80, dtype=np.uint16).tobytes())
            else:
                step = 1 << 23
                for start in range(0, n, step):
                    x = rng.standard_normal(min(step, n - start), dtype=np.float32)
                    x *= np.float32(0.02)
                    f.write(to_bf16(x).tobytes())
            done += n * 2
            if progress and i % 400 == 0:
                progress("model: %s, %.2f of %.2f GB, %.0f s" % (name, done / 1e9, off / 1e9,
                                                                 time.time() - t0))
    os.rename(path + ".tmp", path)
    return off


# ---- GGUF ---------------------------------------------------------------------------------


def read_safetensors(path):
    """(header without __metadata__, uint8 memmap of the file, data offset)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
    hdr.pop("__metadata__", None)
    return hdr, np.memmap(path, dtype=np.uint8, mode="r"), 8 + n


def gguf_plan(hf_dir, gguf):
    """What write_gguf writes: [(gguf name, numpy shape, is_f32, producer())],
    producer returning uint16 BF16 bits of that shape. Per-expert tensors are
    stacked into ffn_{gate,up,down}_exps [n_expert, rows, cols]."""
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    n_layers, n_exp = cfg["num_hidden_layers"], cfg["num_experts"]
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3MOE, n_layers)
    hdr, mm, base = read_safetensors(os.path.join(hf_dir, "model.safetensors"))

    def raw(name):
        h = hdr[name]
        if h["dtype"] != "BF16":
            raise ValueError("%s: dtype %s, expected BF16" % (name, h["dtype"]))
        a, b = h["data_offsets"]
        return mm[base + a: base + b].view(np.uint16).reshape(h["shape"])

    plan = []
    for name in hdr:
        if ".mlp.experts." in name:
            continue
        new = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise ValueError("%s: no qwen3moe GGUF name" % name)
        shape = hdr[name]["shape"]
        f32 = len(shape) <= 1 or new.endswith("_norm.weight") or ".ffn_gate_inp." in new
        plan.append((new, shape, f32, (lambda n=name: raw(n))))
    for layer in range(n_layers):
        for wn in ("down_proj", "gate_proj", "up_proj"):
            first = hdr["model.layers.%d.mlp.experts.0.%s.weight" % (layer, wn)]["shape"]
            new = tmap.get_name("model.layers.%d.mlp.experts.%s.weight" % (layer, wn),
                                try_suffixes=(".weight",))

            def stack(layer=layer, wn=wn, first=first):
                out = np.empty([n_exp] + first, dtype=np.uint16)
                for e in range(n_exp):
                    out[e] = raw("model.layers.%d.mlp.experts.%d.%s.weight" % (layer, e, wn))
                return out
            plan.append((new, [n_exp] + first, False, stack))
    return plan


# GGUFWriter method <- config.json key (TextModel.set_gguf_parameters, Qwen2MoeModel)
GGUF_HPARAMS = [
    ("add_block_count", "num_hidden_layers"), ("add_context_length", "max_position_embeddings"),
    ("add_embedding_length", "hidden_size"), ("add_feed_forward_length", "intermediate_size"),
    ("add_head_count", "num_attention_heads"), ("add_head_count_kv", "num_key_value_heads"),
    ("add_rope_freq_base", "rope_theta"), ("add_layer_norm_rms_eps", "rms_norm_eps"),
    ("add_expert_count", "num_experts"), ("add_expert_used_count", "num_experts_per_tok"),
    ("add_key_length", "head_dim"), ("add_value_length", "head_dim"),
    ("add_expert_feed_forward_length", "moe_intermediate_size"),
]


def write_gguf(hf_dir, out, gguf, progress=None):
    """Write the Hugging Face qwen3_moe checkpoint hf_dir (BF16 safetensors, a
    byte-level BPE tokenizer.json) as a qwen3moe GGUF at out, with gguf (llama.cpp's
    gguf-py module), as its convert_hf_to_gguf.py would for Qwen3MoeForCausalLM:
    BF16 bits copied unchanged; 1-D tensors, norms and the router in F32; gpt2
    BPE vocabulary with pre-tokenizer 'qwen2', added special tokens CONTROL, padded
    to vocab_size with [PAD<i>] UNUSED; merges and special ids by gguf.SpecialVocab.
    Streams one tensor at a time (the largest, a stacked expert tensor, is
    n_expert x 3 MB here). out appears only when complete. Returns the tensor count."""
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    arch = gguf.MODEL_ARCH.QWEN3MOE
    w = gguf.GGUFWriter(out + ".tmp", gguf.MODEL_ARCH_NAMES[arch])
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(os.path.basename(os.path.abspath(hf_dir)))
    for method, key in GGUF_HPARAMS:
        getattr(w, method)(cfg[key])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    tj = json.load(open(os.path.join(hf_dir, "tokenizer.json"), encoding="utf-8"))
    vocab = dict(tj["model"]["vocab"])
    added = {a["content"]: a for a in tj.get("added_tokens", [])}
    for a in added.values():
        vocab[a["content"]] = a["id"]
    rev = {i: t for t, i in vocab.items()}
    vocab_size = cfg["vocab_size"]
    if max(rev) >= vocab_size:
        raise ValueError("tokenizer id %d >= vocab_size %d" % (max(rev), vocab_size))
    tokens, types = [], []
    for i in range(vocab_size):
        t = rev.get(i)
        if t is None:
            tokens.append("[PAD%d]" % i)
            types.append(gguf.TokenType.UNUSED)
        elif t in added:
            special = added[t]["special"] or (t.startswith("<|") and t.endswith("|>"))
            tokens.append(t)
            types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(t)
            types.append(gguf.TokenType.NORMAL)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    gguf.SpecialVocab(hf_dir, load_merges=True, n_vocab=vocab_size).add_to_gguf(w)

    plan = gguf_plan(hf_dir, gguf)
    for new, shape, f32, _ in plan:
        n = int(np.prod(shape))
        if f32:
            w.add_tensor_info(new, shape, np.dtype(np.float32), n * 4)
        else:
            w.add_tensor_info(new, shape, np.dtype(np.uint16), n * 2,
                              raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for k, (new, shape, f32, produce) in enumerate(plan):
        a = np.ascontiguousarray(produce())
        if f32:
            a = (a.astype(np.uint32) << np.uint32(16)).view(np.float32)
        w.write_tensor_data(a)
        if progress and k % 40 == 0:
            progress("gguf: [%d/%d] %s" % (k + 1, len(plan), new))
    w.close()
    os.rename(out + ".tmp", out)
    return len(plan)
