#!/usr/bin/python3
"""`shoal run FILE.gguf` for the llama.cpp architectures beyond qwen3moe
(issue 30): deepseek2, qwen2moe, olmoe, glm4moe, llama with experts (Mixtral)
and gpt-oss.

usage: /usr/bin/python3 tests/cli/test_gguf_arch.py --shoal build-test/coordinator/shoal

For each case a tiny random checkpoint of the family (tests/reference/
gen_tiny.py, F32) is written as a GGUF with F32 tensors the way llama.cpp's
converter writes that family (convert_hf_to_gguf.py and conversion/<family>.py
in the llama.cpp snapshot: TextModel.set_gguf_parameters plus the model
class's own keys; its modify_tensors' names, expert stacking and reshapes),
and `shoal run` on the checkpoint directory and on the GGUF must give the
same logits bytes for 16 greedy steps (the weights are the same f32 values,
reshaped back exactly; the float keys are f32 roundings of the config's, which
shoal computes with in f32, and yarn_log_multiplier = f32(0.1 x
mscale_all_dim) is read back as the shortest decimal that rounds to it).

Cases:
  deepseek2 legacy:  DeepSeek-V2-Lite (no q-LoRA, softmax greedy, 2 shared
                     experts, YaRN x40 with mscale 0.707, a leading dense
                     layer) as older converters wrote it: attn_kv_b whole,
                     head_count_kv n_head, key/value_length the real heads
  deepseek2 split:   the same checkpoint as the converter writes it today:
                     attn_k_b (transposed) + attn_v_b, head_count_kv 1,
                     key_length kv_lora_rank + rope, *_mla the real heads
  deepseek2 grouped: DeepSeek-V2's group_limited_greedy, 4 groups, x16
  deepseek2 v3:      DeepSeek-V3 (q-LoRA, sigmoid noaux_tc with exp_probs_b,
                     4 groups / top 2, norm, a leading dense layer, MTP
                     layers in the checkpoint that the converter skips)
  deepseek2 kimi:    Kimi-K2 (one group, x2.827, rope theta 5e4 YaRN x32)
  qwen2moe:          Qwen1.5-MoE (q/k/v biases, shared expert + sigmoid gate)
  olmoe:             OLMoE (q/k RMSNorm over the whole projection)
  glm4moe:           GLM-4.5-Air (q/k/v biases, partial rotary, sigmoid
                     router, a leading dense layer, an MTP layer kept in the
                     file as blk.3.*), and GLM-4.5's QK-norm with 2 groups x2.5
  llama (Mixtral):   GQA 4:1, q/k rows permuted by the converter for
                     llama.cpp's pairwise rotation (shoal puts them back)
  gpt-oss:           GptOssModel (conversion/gpt_oss.py): sinks, q/k/v/o
                     biases, alternating windows, YaRN, the router's bias,
                     gate_up_proj split into ffn_gate_exps (even rows) and
                     ffn_up_exps (odd rows) with their biases, YaRN x32
                     unrounded (the file has no truncate key; gpt-oss's
                     config says false, which shoal keeps). A GGUF carries
                     no swiglu_limit (llama.cpp's graph uses gpt-oss's 7.0),
                     so the checkpoint is gen_tiny's at limit 7.0 with
                     gate_up_proj x16 so that the clamp acts. F32 and BF16
                     (--outtype bf16: routers, norms, sinks and biases F32)
                     give the checkpoint's bytes; MXFP4 (the checkpoint's
                     blocks repacked into ggml's block_mxfp4) runs through
                     ggml_dot against int8 activations where the checkpoint
                     runs MXFP4 against f32 ones: the prompt's logits within
                     10 % (measured ~3 %; a GGUF of the same values
                     dequantized to F32 matches to 5e-6, and one with the
                     nibbles left in the checkpoint's order is off by ~130 %),
                     so greedy runs part at near ties of this random model.
                     Every case gives its own bytes again with the experts
                     streamed through a 1 MB cache (the bias ranges).
                     rope.scaling.yarn_attn_factor (with yarn_ext_factor 1)
                     gives the checkpoint's run with that attention_factor
  deepseek2 MTP:     V3 with its MTP layer kept (block_count counts it,
                     nextn_predict_layers 1): its draft logits (--draft-logits-out)
                     are the checkpoint's bytes, as glm4moe's
  kv_b F16:          the split deepseek2 file with attn_k_b / attn_v_b F16
  kv_b as shipped:   attn_k_b F16 and attn_v_b Q8_0: run per head as shipped,
                     against the file of their values in F32; batches, the
                     scalar kernels and `shoal convert` of it
  bad:               a missing key, a key shoal does not read, yarn_ext_factor
                     other than 1, a wrong shape of attn_k_b: exit 2 with one
                     line naming it
Ends with "N passed, M failed"; exit status 1 if anything failed.
"""

import argparse
import contextlib
import json
import os
import re
import shutil
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "reference"))
import harness as H  # noqa: E402
from gguf_writer import encode_float, kv, q8_0_bytes, read_safetensors, write_gguf  # noqa: E402
import gen_tiny  # noqa: E402

result = H.Results()
ARGS = ["--tokens", ",".join(map(str, gen_tiny.PROMPT)), "--max-tokens", "16", "--greedy"]

# HF layer tensor suffix -> llama.cpp's (gguf-py tensor_mapping.py)
LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.q_a_proj.weight": "attn_q_a.weight",
    "self_attn.q_a_layernorm.weight": "attn_q_a_norm.weight",
    "self_attn.q_b_proj.weight": "attn_q_b.weight",
    "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
    "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight",
    "self_attn.kv_b_proj.weight": "attn_kv_b.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "block_sparse_moe.gate.weight": "ffn_gate_inp.weight",
    "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
}
# the MTP layers' own tensors (glm4moe keeps them, as blk.N.nextn.*)
NEXTN = {"eh_proj.weight": "nextn.eh_proj.weight", "enorm.weight": "nextn.enorm.weight",
         "hnorm.weight": "nextn.hnorm.weight",
         "shared_head.norm.weight": "nextn.shared_head_norm.weight"}
TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
       "lm_head.weight": "output.weight"}


def permute(w, n_head):
    """LlamaModel.permute: per head, rows (half s, i) -> (i, half s)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]) \
        .swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(st, cfg, split_kv_b, keep_mtp=False, permute_qk=False):
    """[(llama.cpp name, f32 array)] as the converter's modify_tensors gives
    them: experts stacked per layer (ne {n_in, n_out, n_expert}), MTP layers
    skipped (DeepseekV2Model.skip_mtp) or with keep_mtp kept (Glm4MoeModel),
    with permute_qk q/k rows permuted as LlamaModel.permute does, and with
    split_kv_b kv_b_proj cut as
    DeepseekV2Model does: view(n_head, nope + v, kvl), split, k_b transposed."""
    L = cfg["num_hidden_layers"]
    out, experts = [], {}
    for name, x in st.items():
        if name in TOP:
            out.append((TOP[name], x))
            continue
        m = re.match(r"model\.layers\.(\d+)\.(.*)$", name)
        il, rest = int(m.group(1)), m.group(2)
        if il >= L and not keep_mtp:
            continue
        if il >= L and rest in NEXTN:
            out.append(("blk.%d.%s" % (il, NEXTN[rest]), x))
            continue
        e = re.match(r"(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(gate_proj|up_proj|"
                     r"down_proj|w1|w3|w2)\.weight$", rest)
        if e:
            w = {"w1": "gate", "w3": "up", "w2": "down"}.get(e.group(2), e.group(2)[:-5])
            experts.setdefault((il, w), {})[int(e.group(1))] = x
            continue
        if permute_qk and rest in ("self_attn.q_proj.weight", "self_attn.k_proj.weight"):
            n = cfg["num_attention_heads"] if "q_proj" in rest else cfg["num_key_value_heads"]
            x = permute(x, n)
        if rest == "self_attn.kv_b_proj.weight" and split_kv_b:
            H_, nope, v = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
            kvb = x.reshape(H_, nope + v, x.shape[-1])
            out.append(("blk.%d.attn_k_b.weight" % il,
                        np.ascontiguousarray(kvb[:, :nope, :].transpose(0, 2, 1))))
            out.append(("blk.%d.attn_v_b.weight" % il, np.ascontiguousarray(kvb[:, nope:, :])))
            continue
        name = LAYER[rest]
        if cfg["model_type"] == "glm4_moe" and name == "ffn_norm.weight":
            # Glm4MoeModel: GLM4_MOE has ATTN_POST_NORM, not FFN_NORM, so
            # gguf-py maps post_attention_layernorm there
            name = "post_attention_norm.weight"
        out.append(("blk.%d.%s" % (il, name), x))
    for (il, w), d in sorted(experts.items()):
        out.append(("blk.%d.ffn_%s_exps.weight" % (il, w), np.stack([d[i] for i in sorted(d)])))
    return out


def base_kvs(arch, c):
    """TextModel.set_gguf_parameters for config c (a dict)."""
    a = arch + "."
    k = [("general.architecture", "str", arch), ("general.name", "str", "tiny-" + arch),
         (a + "block_count", "u32", c["num_hidden_layers"]),
         (a + "context_length", "u32", c["max_position_embeddings"]),
         (a + "embedding_length", "u32", c["hidden_size"])]
    if "intermediate_size" in c:
        k.append((a + "feed_forward_length", "u32", c["intermediate_size"]))
    k.append((a + "attention.head_count", "u32", c["num_attention_heads"]))
    if "num_key_value_heads" in c:
        k.append((a + "attention.head_count_kv", "u32", c["num_key_value_heads"]))
    rs = c.get("rope_scaling") or {}
    rtype = rs.get("rope_type", rs.get("type"))
    if rtype == "yarn":
        k += [(a + "rope.scaling.type", "str", "yarn"),
              (a + "rope.scaling.factor", "f32", rs["factor"]),
              (a + "rope.scaling.original_context_length", "u32",
               rs["original_max_position_embeddings"])]
        for hf, ll in (("beta_fast", "yarn_beta_fast"), ("beta_slow", "yarn_beta_slow")):
            if hf in rs:
                k.append((a + "rope.scaling." + ll, "f32", rs[hf]))
    if "rope_theta" in c:
        k.append((a + "rope.freq_base", "f32", c["rope_theta"]))
    if c.get("rms_norm_eps") is not None:
        k.append((a + "attention.layer_norm_rms_epsilon", "f32", c["rms_norm_eps"]))
    n_exp = c.get("num_local_experts", c.get("num_experts", c.get("n_routed_experts")))
    k += [(a + "expert_count", "u32", n_exp),
          (a + "expert_used_count", "u32", c["num_experts_per_tok"])]
    if c.get("n_group") is not None:
        k.append((a + "expert_group_count", "u32", c["n_group"]))
    if c.get("topk_group") is not None:
        k.append((a + "expert_group_used_count", "u32", c["topk_group"]))
    if c.get("scoring_func") is not None:
        k.append((a + "expert_gating_func", "u32", {"softmax": 1, "sigmoid": 2}[c["scoring_func"]]))
    if c.get("head_dim") is not None:
        k += [(a + "attention.key_length", "u32", c["head_dim"]),
              (a + "attention.value_length", "u32", c["head_dim"])]
    return k


def deepseek2_kvs(c, split_kv_b, nextn=False):
    """DeepseekV2Model.set_gguf_parameters (num_key_value_heads set to 1
    first); without split_kv_b the older converter's MHA view; with nextn
    the MTP layers kept as DeepseekV32Model keeps them (block_count counts
    them, nextn_predict_layers)."""
    c = dict(c)
    if nextn:
        c["num_hidden_layers"] += c["num_nextn_predict_layers"]
    if split_kv_b:
        c["num_key_value_heads"] = 1
    c.setdefault("rms_norm_eps", 1e-6)
    k = base_kvs("deepseek2", c)
    a = "deepseek2."
    kvl, rope = c["kv_lora_rank"], c["qk_rope_head_dim"]
    k += [(a + "leading_dense_block_count", "u32", c.get("first_k_dense_replace") or 0),
          (a + "vocab_size", "u32", c["vocab_size"])]
    if c.get("q_lora_rank") is not None:
        k.append((a + "attention.q_lora_rank", "u32", c["q_lora_rank"]))
    k.append((a + "attention.kv_lora_rank", "u32", kvl))
    if split_kv_b:
        k += [(a + "attention.key_length", "u32", kvl + rope),
              (a + "attention.value_length", "u32", kvl),
              (a + "attention.key_length_mla", "u32", c["qk_nope_head_dim"] + rope),
              (a + "attention.value_length_mla", "u32", c["v_head_dim"])]
    else:
        k += [(a + "attention.key_length", "u32", c["qk_nope_head_dim"] + rope),
              (a + "attention.value_length", "u32", c["v_head_dim"])]
    k += [(a + "expert_feed_forward_length", "u32", c["moe_intermediate_size"]),
          (a + "expert_shared_count", "u32", c.get("n_shared_experts", 0))]
    if c.get("routed_scaling_factor") is not None:
        k.append((a + "expert_weights_scale", "f32", c["routed_scaling_factor"]))
    if c.get("norm_topk_prob"):
        k.append((a + "expert_weights_norm", "bool", True))
    k.append((a + "rope.dimension_count", "u32", rope))
    rs = c.get("rope_scaling") or {}
    if rs.get("mscale_all_dim") is not None:
        k.append((a + "rope.scaling.yarn_log_multiplier", "f32", 0.1 * rs["mscale_all_dim"]))
    if nextn:
        k.append((a + "nextn_predict_layers", "u32", c["num_nextn_predict_layers"]))
    return k


def qwen2moe_kvs(c):
    """Qwen2MoeModel.set_gguf_parameters."""
    return base_kvs("qwen2moe", c) + [
        ("qwen2moe.expert_feed_forward_length", "u32", c["moe_intermediate_size"]),
        ("qwen2moe.expert_shared_feed_forward_length", "u32",
         c["shared_expert_intermediate_size"])]


def olmoe_kvs(c):
    """OlmoeModel.set_gguf_parameters: the base keys (the experts' width is
    OLMoE's intermediate_size, feed_forward_length, which llama.cpp's olmoe
    reads as n_ff), then the rms epsilon again as 1e-5 (the writer keeps the
    last value of a key written twice)."""
    k = [x for x in base_kvs("olmoe", c) if x[0] != "olmoe.attention.layer_norm_rms_epsilon"]
    return k + [("olmoe.attention.layer_norm_rms_epsilon", "f32", 1e-5)]


def glm4moe_kvs(c):
    """Glm4MoeModel.set_gguf_parameters: block_count counts the MTP layers."""
    c = dict(c, num_hidden_layers=c["num_hidden_layers"] + c.get("num_nextn_predict_layers", 0))
    a = "glm4moe."
    k = base_kvs("glm4moe", c)
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    k += [(a + "rope.dimension_count", "u32", int(hd * c.get("partial_rotary_factor", 0.5))),
          (a + "expert_count", "u32", c["n_routed_experts"]),
          (a + "expert_feed_forward_length", "u32", c["moe_intermediate_size"]),
          (a + "expert_shared_count", "u32", c["n_shared_experts"]),
          (a + "leading_dense_block_count", "u32", c["first_k_dense_replace"]),
          (a + "expert_gating_func", "u32", 2)]
    if c.get("routed_scaling_factor") is not None:
        k.append((a + "expert_weights_scale", "f32", c["routed_scaling_factor"]))
    if c.get("norm_topk_prob") is not None:
        k.append((a + "expert_weights_norm", "bool", c["norm_topk_prob"]))
    if c.get("num_nextn_predict_layers") is not None:
        k.append((a + "nextn_predict_layers", "u32", c["num_nextn_predict_layers"]))
    # the writer keeps the last value of a key written twice
    last = {}
    for x in k:
        last[x[0]] = x
    return list(last.values())


def llama_kvs(c):
    """LlamaModel.set_gguf_parameters (Mixtral: experts intermediate_size
    wide, written as feed_forward_length)."""
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return base_kvs("llama", c) + [("llama.vocab_size", "u32", c["vocab_size"]),
                                   ("llama.rope.dimension_count", "u32", hd)]


# name -> (gen_tiny spec, metadata(cfg), kv_b_proj split)
CASES = {
    "deepseek2 legacy": ("deepseek_v2", lambda c: deepseek2_kvs(c, False), False),
    "deepseek2 split": ("deepseek_v2", lambda c: deepseek2_kvs(c, True), True),
    "deepseek2 grouped": ("deepseek_v2_grouped", lambda c: deepseek2_kvs(c, True), True),
    "deepseek2 v3": ("deepseek_v3", lambda c: deepseek2_kvs(c, True), True),
    "deepseek2 kimi": ("kimi_k2", lambda c: deepseek2_kvs(c, True), True),
    "deepseek2 v3 MTP kept": ("deepseek_v3", lambda c: deepseek2_kvs(c, True, nextn=True), True),
    "qwen2moe": ("qwen2_moe", qwen2moe_kvs, False),
    "olmoe": ("olmoe", olmoe_kvs, False),
    "glm4moe": ("glm4_moe", glm4moe_kvs, False),
    "glm4moe qk-norm": ("glm4_moe_qknorm", glm4moe_kvs, False),
    "llama (Mixtral)": ("mixtral", llama_kvs, False),
}


def shoal_run(shoal, model, out):
    r = H.run([shoal, "run", model] + ARGS + ["--logits-out", out], timeout=120)
    return r, (np.load(out) if r.returncode == 0 and os.path.exists(out) else None)


def show(r):
    return "exit %d: %s" % (r.returncode, (r.stderr or "").strip()[-400:])


def encode(x, typ):
    """A float array as typ, or (shape array, bytes) as its bytes (MXFP4)."""
    return x[1] if isinstance(x, tuple) else encode_float(x, typ)


def write(path, cfg, tensors, kvs, types=None):
    """types: {name: ggml type} for tensors not F32."""
    eos = cfg.get("eos_token_id")
    extra = [("tokenizer.ggml.eos_token_id", "u32", eos)] if isinstance(eos, int) else []
    write_gguf(path, [kv(*k) for k in kvs + extra],
               [(n, x, (types or {}).get(n, "F32")) for n, x in tensors], encode=encode)


def check_case(shoal, tmp, label, d, make_kvs, split):
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    st = {}
    for fn in sorted(os.listdir(d)):
        if fn.endswith(".safetensors"):
            st.update(read_safetensors(os.path.join(d, fn)))
    permute_qk = cfg["model_type"] == "mixtral"
    tensors = gguf_tensors(st, cfg, split, keep_mtp=cfg["model_type"] == "glm4_moe" or
                           "MTP kept" in label, permute_qk=permute_qk)
    path = os.path.join(tmp, label.replace(" ", "-") + ".gguf")
    write(path, cfg, tensors, make_kvs(cfg))
    r0, ref = shoal_run(shoal, d, os.path.join(tmp, label + "-ref.npy"))
    r1, got = shoal_run(shoal, path, os.path.join(tmp, label + "-gguf.npy"))
    if not result("%s: the checkpoint runs" % label, ref is not None, show(r0)):
        return tensors, cfg, None
    diff = "" if got is None or got.shape != ref.shape else \
        "max |diff| %g" % float(np.max(np.abs(got - ref)))
    result("%s GGUF: 16 greedy steps' logits are the checkpoint's bytes" % label,
           got is not None and got.shape == ref.shape and got.tobytes() == ref.tobytes(),
           show(r1) + " " + diff)
    keep = cfg["model_type"] == "glm4_moe" or "MTP kept" in label
    if keep and cfg.get("num_nextn_predict_layers"):   # the MTP layer the file keeps
        drafts = []
        for m, tag in ((d, "ref"), (path, "gguf")):
            out = os.path.join(tmp, "%s-%s-draft.npy" % (label, tag))
            r = H.run([shoal, "run", m] + ARGS + ["--draft-logits-out", out], timeout=120)
            drafts.append((r, open(out, "rb").read() if r.returncode == 0 and
                           os.path.exists(out) else None))
        result("%s GGUF: its MTP layer's draft logits are the checkpoint's bytes" % label,
               drafts[0][1] is not None and drafts[0][1] == drafts[1][1],
               show(drafts[0][0]) + " / " + show(drafts[1][0]))
        ct = os.path.join(tmp, label.replace(" ", "-") + ".ct")   # convert keeps the layer
        cv = H.run([shoal, "convert", path, ct], timeout=120)
        out = os.path.join(tmp, "%s-ct-draft.npy" % label)
        r = H.run([shoal, "run", ct] + ARGS + ["--draft-logits-out", out], timeout=120)
        result("%s GGUF converted: the container's MTP draft logits are the file's bytes" % label,
               cv.returncode == 0 and r.returncode == 0 and os.path.exists(out) and
               open(out, "rb").read() == drafts[1][1], show(cv) + " / " + show(r))
    if permute_qk:   # the permutation matters: the file without it computes otherwise
        plain = gguf_tensors(st, cfg, split)
        write(path, cfg, plain, make_kvs(cfg))
        r2, got2 = shoal_run(shoal, path, os.path.join(tmp, label + "-plain.npy"))
        result("%s GGUF with q/k not permuted: other logits (shoal undoes the permutation)"
               % label, got2 is not None and got2.tobytes() != ref.tobytes(), show(r2))
    return tensors, cfg, ref


def check_f16_kv_b(shoal, tmp, tensors, cfg, ref):
    """attn_k_b / attn_v_b in F16: the interleave copies 2-byte elements;
    the run follows the F32 file's tokens, logits within F16's rounding."""
    path = os.path.join(tmp, "kv_b-f16.gguf")
    f16 = {n: "F16" for n, _ in tensors if "attn_k_b" in n or "attn_v_b" in n}
    write(path, cfg, tensors, deepseek2_kvs(cfg, True), f16)
    r, got = shoal_run(shoal, path, os.path.join(tmp, "kv_b-f16.npy"))
    ok = got is not None and got.shape == ref.shape
    diff = float(np.max(np.abs(got - ref))) if ok else float("inf")
    result("deepseek2 split, attn_k_b/attn_v_b F16: the F32 run's tokens, max |diff| %.3g "
           "< 0.05 of logits up to %.1f" % (diff, float(np.abs(ref).max())),
           ok and diff < 0.05 and got.tobytes() != ref.tobytes() and
           [int(np.argmax(x)) for x in got] == [int(np.argmax(x)) for x in ref], show(r))


def q8_0_values(x):
    """The values x's Q8_0 encoding holds, as f32 (gguf-py's dequantize: q * d)."""
    b = np.frombuffer(q8_0_bytes(x), dtype=[("d", "<f2"), ("q", "i1", 32)])
    return (b["q"].astype(np.float32) * b["d"].astype(np.float32)[:, None]).reshape(x.shape)


def check_native_kv_b(shoal, tmp, tensors, cfg):
    """attn_k_b F16 and attn_v_b Q8_0 (two types, one a block type, as the
    big GGUF mixes ship them): each head's rows run as shipped (mla.c: a
    matvec per head, Q8_0 against int8 activations) instead of kv_b_proj.
    Against the file with the same values in F32 (interleaved into
    kv_b_proj): logits within 0.15 while the greedy tokens agree, other
    bytes.
    Prefill one token a step, three at once and the scalar kernels: the
    same bytes. `shoal convert` and `shoal shard` of it keep the two types
    and run its bytes; `shoal convert --dense f32` (kv_b_proj in F32, the
    exact values) runs the F32 file's bytes."""
    kb = lambda n: "attn_k_b" in n   # noqa: E731
    vb = lambda n: "attn_v_b" in n   # noqa: E731
    native = [(n, (x, q8_0_bytes(x)) if vb(n) else x) for n, x in tensors]
    types = {n: "F16" if kb(n) else "Q8_0" for n, _ in tensors if kb(n) or vb(n)}
    exact = [(n, q8_0_values(x) if vb(n) else
              x.astype(np.float16).astype(np.float32) if kb(n) else x) for n, x in tensors]
    path, path_f32 = os.path.join(tmp, "kv_b-native.gguf"), os.path.join(tmp, "kv_b-f32.gguf")
    write(path, cfg, native, deepseek2_kvs(cfg, True), types)
    write(path_f32, cfg, exact, deepseek2_kvs(cfg, True))
    r0, want = shoal_run(shoal, path_f32, os.path.join(tmp, "kv_b-f32.npy"))
    r, got = shoal_run(shoal, path, os.path.join(tmp, "kv_b-native.npy"))
    ok = got is not None and want is not None and got.shape == want.shape
    # the steps whose inputs agree (every earlier greedy token the same): int8
    # activations move logits by ~1 %, so a near tie of this random model may
    # part the runs after that (measured: 0.03-0.07 over the first 5 steps,
    # then a tie at 0.06); a wrong row order moves them by whole units
    steps, diff = 0, float("inf")
    if ok:
        while steps < len(got) and (steps == 0 or np.argmax(got[steps - 1]) ==
                                    np.argmax(want[steps - 1])):
            steps += 1
        diff = float(np.max(np.abs(got[:steps] - want[:steps])))
    result("deepseek2 split, attn_k_b F16 + attn_v_b Q8_0 run as shipped: the F32 file's "
           "logits within 0.15 (max |diff| %.3g over the %d steps with the same inputs, "
           "logits up to %.1f), other bytes" %
           (diff, steps, float(np.abs(want).max()) if ok else 0.0),
           ok and steps >= 3 and diff < 0.15 and got.tobytes() != want.tobytes(),
           show(r) + " / " + show(r0))
    same = []
    for i, extra in enumerate((["--batch", "1"], ["--batch", "3"], ["--isa", "scalar"])):
        out = os.path.join(tmp, "kv_b-native-%d.npy" % i)
        r2 = H.run([shoal, "run", path] + ARGS + ["--logits-out", out] + extra, timeout=120)
        same.append(r2.returncode == 0 and got is not None and
                    open(out, "rb").read() == open(os.path.join(tmp, "kv_b-native.npy"),
                                                   "rb").read())
    result("deepseek2 split kv_b as shipped: prefill batches 1, 3 and the scalar kernels give "
           "the same bytes", all(same), "same: %s" % same)
    nan = b"\x00\x7e"   # an f16 NaN over block 0's scale
    bad = [(n, (x[0], nan + x[1][2:]) if n == "blk.0.attn_v_b.weight" else x)
           for n, x in native]
    path_bad = os.path.join(tmp, "kv_b-nan.gguf")
    write(path_bad, cfg, bad, deepseek2_kvs(cfg, True), types)
    r4 = H.run([shoal, "run", path_bad] + ARGS, timeout=60)
    lines = (r4.stderr or "").strip().splitlines()
    result("deepseek2 split kv_b as shipped, a NaN block scale in attn_v_b: exit 2, one line "
           "naming it", r4.returncode == 2 and len(lines) == 1 and
           "blk.0.attn_v_b.weight" in lines[0], show(r4))
    ct = os.path.join(tmp, "kv_b-native.ct")
    cv = H.run([shoal, "convert", path, ct], timeout=120)
    r3, conv = shoal_run(shoal, ct, os.path.join(tmp, "kv_b-native-ct.npy"))
    kept = {}
    if cv.returncode == 0:
        with open(os.path.join(ct, "shoal.json")) as f:
            kept = {t["name"]: t.get("ggml_type", t["dtype"]) for t in json.load(f)["dense"]["tensors"]
                    if t["name"].startswith("blk.0.attn_")}
    result("deepseek2 split kv_b as shipped, converted: the container keeps attn_k_b F16 and "
           "attn_v_b Q8_0 (no attn_kv_b) and runs the GGUF's bytes",
           cv.returncode == 0 and conv is not None and got is not None and
           conv.tobytes() == got.tobytes() and
           str(kept.get("blk.0.attn_k_b", "")).upper() == "F16" and
           str(kept.get("blk.0.attn_v_b", "")).upper() == "Q8_0" and
           "blk.0.attn_kv_b" not in kept, show(cv) + " / " + show(r3) + " / %s" % kept)
    ct32 = os.path.join(tmp, "kv_b-native-f32.ct")   # requantized: kv_b_proj whole
    cv32 = H.run([shoal, "convert", path, ct32, "--dense", "f32"], timeout=120)
    r7, conv32 = shoal_run(shoal, ct32, os.path.join(tmp, "kv_b-native-ct32.npy"))
    result("deepseek2 split kv_b as shipped, converted --dense f32 (kv_b_proj in F32, the "
           "exact values): the F32 file's bytes",
           cv32.returncode == 0 and conv32 is not None and want is not None and
           conv32.tobytes() == want.tobytes(), show(cv32) + " / " + show(r7))
    sh = os.path.join(tmp, "kv_b-native-shard")   # shard keeps the types as convert does
    r5 = H.run([shoal, "shard", path, "--shards", "1", "--out", sh], timeout=120)
    r6, shd = shoal_run(shoal, os.path.join(sh, "model"), os.path.join(tmp, "kv_b-shard.npy"))
    result("deepseek2 split kv_b as shipped, sharded: its model runs the GGUF's bytes",
           r5.returncode == 0 and shd is not None and got is not None and
           shd.tobytes() == got.tobytes(), show(r5) + " / " + show(r6))


def check_bad(shoal, tmp, tensors, cfg):
    kvs = deepseek2_kvs(cfg, True)
    wrong = [(n, x[:, :-1, :] if n == "blk.1.attn_k_b.weight" else x) for n, x in tensors]
    cases = [
        ("a missing key", [k for k in kvs if k[0] != "deepseek2.attention.kv_lora_rank"],
         tensors, ["deepseek2.attention.kv_lora_rank", "missing"]),
        ("a key shoal does not read", kvs + [("deepseek2.attention.temperature_scale", "f32",
                                              1.0)],
         tensors, ["deepseek2.attention.temperature_scale", "refused"]),
        ("yarn_ext_factor other than 1", kvs + [("deepseek2.rope.scaling.yarn_ext_factor",
                                                 "f32", 0.5)],
         tensors, ["deepseek2.rope.scaling.yarn_ext_factor", "expected 1"]),
        ("a wrong attn_k_b shape", kvs, wrong, ["blk.1.attn_k_b.weight", "shape"]),
        ("attn_v_b missing", kvs, [t for t in tensors if t[0] != "blk.0.attn_v_b.weight"],
         ["blk.0.attn_v_b.weight", "attn_kv_b"]),
    ]
    for i, (name, k, t, needles) in enumerate(cases):
        path = os.path.join(tmp, "bad-%d.gguf" % i)
        write(path, cfg, t, k)
        r = H.run([shoal, "run", path] + ARGS, timeout=60)
        lines = (r.stderr or "").strip().splitlines()
        result("bad deepseek2 GGUF (%s): exit 2, one line naming %s" % (name, ", ".join(needles)),
               r.returncode == 2 and len(lines) == 1 and all(n in lines[0] for n in needles),
               show(r))


# ---- gpt-oss -----------------------------------------------------------------

GPTOSS_LAYER = dict(LAYER, **{
    "post_attention_layernorm.weight": "post_attention_norm.weight",   # ATTN_POST_NORM
    "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.sinks": "attn_sinks.weight",   # filter_tensors appends ".weight"
    "mlp.router.weight": "ffn_gate_inp.weight", "mlp.router.bias": "ffn_gate_inp.bias",
})
GPTOSS_SCALE_LOG2 = 4   # gate_up_proj x 16: gate and up values past the limit 7


def mxfp4_repack(blocks, scales):
    """ggml's block_mxfp4 bytes [..., nb, 17] from the checkpoint's blocks
    [..., nb, 16] (byte k: element 2k in the low nibble, 2k + 1 in the high)
    and E8M0 scales [..., nb]: the scale byte, then qs[j] = code of element
    j | code of element j + 16 << 4 (ggml-common.h; GptOssModel.repack_mxfp4
    does this with its transform_nibble_layout)."""
    codes = np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(*blocks.shape[:-1], 32)
    qs = codes[..., :16] | (codes[..., 16:] << 4)
    return np.concatenate([scales[..., None], qs], axis=-1).astype(np.uint8)


def gptoss_tensors(st):
    """[(llama.cpp name, array or (shape array, MXFP4 bytes))] as
    GptOssModel writes them: gate_up_proj (input-major [n, E, 2F])
    transposed, rows 0::2 ffn_gate_exps and 1::2 ffn_up_exps, its bias split
    the same way; down_proj transposed; MXFP4 blocks + scales repacked
    (gate_up's rows split likewise), ne {n_in, n_out, n_expert}."""
    out = []
    for name, x in st.items():
        if name in TOP:
            out.append((TOP[name], x))
            continue
        m = re.match(r"model\.layers\.(\d+)\.(.*)$", name)
        p, rest = "blk.%s." % m.group(1), m.group(2)
        if rest == "mlp.experts.gate_up_proj":
            w = x.transpose(0, 2, 1)
            out += [(p + "ffn_gate_exps.weight", np.ascontiguousarray(w[:, 0::2])),
                    (p + "ffn_up_exps.weight", np.ascontiguousarray(w[:, 1::2]))]
        elif rest == "mlp.experts.gate_up_proj_bias":
            out += [(p + "ffn_gate_exps.bias", np.ascontiguousarray(x[:, 0::2])),
                    (p + "ffn_up_exps.bias", np.ascontiguousarray(x[:, 1::2]))]
        elif rest == "mlp.experts.down_proj":
            out.append((p + "ffn_down_exps.weight", np.ascontiguousarray(x.transpose(0, 2, 1))))
        elif rest == "mlp.experts.down_proj_bias":
            out.append((p + "ffn_down_exps.bias", x))
        elif rest.endswith("_blocks"):
            blk = mxfp4_repack(x, st[name[:-len("_blocks")] + "_scales"])
            parts = ([("ffn_gate_exps", blk[:, 0::2]), ("ffn_up_exps", blk[:, 1::2])]
                     if "gate_up" in rest else [("ffn_down_exps", blk)])
            for n, b in parts:
                shape = (b.shape[0], b.shape[1], b.shape[2] * 32)
                out.append((p + n + ".weight", (np.broadcast_to(np.uint8(0), shape),
                                                np.ascontiguousarray(b).tobytes())))
        elif not rest.endswith("_scales"):
            out.append((p + GPTOSS_LAYER[rest], x))
    return out


def gptoss_types(tensors, outtype):
    """The converter's type per tensor for --outtype outtype (F32 or BF16):
    1-D tensors, norms, routers (FFN_GATE_INP) and whatever is not a
    '.weight' (biases) stay F32; MXFP4 stays MXFP4."""
    types = {}
    for n, x in tensors:
        if isinstance(x, tuple):
            types[n] = "MXFP4"
        elif outtype == "F32" or x.ndim <= 1 or n.endswith("_norm.weight") or \
                ".ffn_gate_inp." in n or not n.endswith(".weight"):
            types[n] = "F32"
        else:
            types[n] = "BF16"
    return types


def gptoss_kvs(c, extra=()):
    """GptOssModel.set_gguf_parameters: the base keys (YaRN from rope_scaling;
    truncate is not written), sliding_window, expert_feed_forward_length."""
    return base_kvs("gpt-oss", c) + [
        ("gpt-oss.attention.sliding_window", "u32", c["sliding_window"]),
        ("gpt-oss.expert_feed_forward_length", "u32", c["intermediate_size"])] + list(extra)


def gptoss_checkpoint(src, dst, limit, bf16):
    """gen_tiny's gpt-oss checkpoint src at swiglu_limit `limit` with
    gate_up_proj and its bias x 2^GPTOSS_SCALE_LOG2 (exact: MXFP4 scales +4)."""
    shutil.copytree(src, dst)
    with open(os.path.join(dst, "config.json")) as f:
        cfg = json.load(f)
    cfg["swiglu_limit"] = limit
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    st = read_safetensors(os.path.join(src, "model.safetensors"))
    k = GPTOSS_SCALE_LOG2
    tensors = []
    for name, x in st.items():
        if name.endswith(("gate_up_proj", "gate_up_proj_bias")):
            x = x * np.float32(2 ** k)
        elif name.endswith("gate_up_proj_scales"):
            x = (x + k).astype(np.uint8)
        if x.dtype == np.uint8 or not bf16:
            tensors.append((name, x))
        else:
            tensors += gen_tiny.make_bf16([(name, x)])
    gen_tiny.write_checkpoint(dst, tensors, 1)
    return cfg, read_safetensors(os.path.join(dst, "model.safetensors"))


def check_gptoss(shoal, tmp, ckpt):
    label = "gpt-oss"
    ref32 = None
    for spec, outtype in (("gpt_oss", "F32"), ("gpt_oss_bf16", "BF16"),
                          ("gpt_oss_mxfp4", "BF16")):
        d = os.path.join(tmp, spec + "-7")
        cfg, st = gptoss_checkpoint(os.path.join(ckpt, spec), d, 7.0, spec != "gpt_oss")
        tensors = gptoss_tensors(st)
        mx = spec.endswith("mxfp4")
        kind = "MXFP4" if mx else outtype
        path = os.path.join(tmp, "%s.gguf" % spec)
        write(path, cfg, tensors, gptoss_kvs(cfg), gptoss_types(tensors, outtype))
        r0, ref = shoal_run(shoal, d, os.path.join(tmp, spec + "-ref.npy"))
        r1, got = shoal_run(shoal, path, os.path.join(tmp, spec + "-gguf.npy"))
        if not result("%s %s: the checkpoint runs" % (label, kind), ref is not None, show(r0)):
            continue
        ok = got is not None and got.shape == ref.shape
        diff = float(np.max(np.abs(got - ref))) if ok else float("inf")
        if not mx:
            result("%s %s GGUF: 16 greedy steps' logits are the checkpoint's bytes" %
                   (label, kind), ok and got.tobytes() == ref.tobytes(),
                   show(r1) + " max |diff| %g" % diff)
        else:   # the first step only: later ones follow their own greedy tokens
            top = float(np.abs(ref[0]).max())
            d0 = float(np.max(np.abs(got[0] - ref[0]))) if ok else float("inf")
            result("%s MXFP4 GGUF (ggml_dot, int8 activations): the prompt's logits within "
                   "max |diff| %.3g < 0.1 x max |logit| %.2f (the checkpoint's nibble order "
                   "left in place gives ~1.3x), the same first token" % (label, d0, top),
                   ok and d0 < 0.1 * top and int(np.argmax(got[0])) == int(np.argmax(ref[0])),
                   show(r1))
        if got is not None:   # the streamed store picks up the expert biases
            r2, got2 = H.run([shoal, "run", path] + ARGS + [
                "--logits-out", os.path.join(tmp, spec + "-1mb.npy"), "--expert-cache", "1MB",
                "--direct", "on"], timeout=120), None
            if r2.returncode == 0:
                got2 = np.load(os.path.join(tmp, spec + "-1mb.npy"))
            result("%s %s GGUF, experts streamed through a 1 MB cache: the same bytes" %
                   (label, kind), got2 is not None and got2.tobytes() == got.tobytes(),
                   show(r2))
        if spec == "gpt_oss":
            ref32 = (cfg, tensors, ref)
    if ref32 is None:
        return
    cfg, tensors, ref = ref32
    # the clamp acts on these weights: the same checkpoint unclamped computes otherwise
    d = os.path.join(tmp, "gpt_oss-big")
    gptoss_checkpoint(os.path.join(ckpt, "gpt_oss"), d, 1e9, False)
    r, big = shoal_run(shoal, d, os.path.join(tmp, "gpt_oss-big.npy"))
    result("%s: swiglu_limit 1e9 gives other logits (the limit 7.0 clamps here)" % label,
           big is not None and big.tobytes() != ref.tobytes(), show(r))
    # the window pattern: llama.cpp's default period 2 written out, as a
    # period and per layer; period 3 (layers 0 and 1 windowed) computes otherwise
    L = cfg["num_hidden_layers"]
    key = "gpt-oss.attention.sliding_window_pattern"
    for what, extra, same in (
            ("period 2", [(key, "u32", 2)], True),
            ("per layer", [(key, ("arr", "bool"), [il % 2 == 0 for il in range(L)])], True),
            ("period 3", [(key, "u32", 3)], False)):
        path = os.path.join(tmp, "gpt-oss-swa.gguf")
        write(path, cfg, tensors, gptoss_kvs(cfg, extra))
        r, got = shoal_run(shoal, path, os.path.join(tmp, "gpt-oss-swa.npy"))
        result("%s sliding_window_pattern %s: %s" % (label, what, "the checkpoint's bytes" if
                                                     same else "other logits"),
               got is not None and (got.tobytes() == ref.tobytes()) == same, show(r))
    # YaRN's attention_factor as the converter writes it (yarn_attn_factor,
    # with yarn_ext_factor 1): the checkpoint's scale of cos and sin
    d = os.path.join(tmp, "gpt_oss-af")
    gptoss_checkpoint(os.path.join(ckpt, "gpt_oss"), d, 7.0, False)
    with open(os.path.join(d, "config.json")) as f:
        c2 = json.load(f)
    c2["rope_scaling"]["attention_factor"] = 1.25
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c2, f, indent=2)
    r0, ref_af = shoal_run(shoal, d, os.path.join(tmp, "gpt_oss-af.npy"))
    path = os.path.join(tmp, "gpt-oss-af.gguf")
    write(path, cfg, tensors, gptoss_kvs(cfg, [
        ("gpt-oss.rope.scaling.yarn_ext_factor", "f32", 1.0),
        ("gpt-oss.rope.scaling.yarn_attn_factor", "f32", 1.25)]))
    r1, got = shoal_run(shoal, path, os.path.join(tmp, "gpt-oss-af-gguf.npy"))
    result("%s rope.scaling.yarn_attn_factor 1.25 (+ yarn_ext_factor 1): the bytes of the "
           "checkpoint with attention_factor 1.25, not those without" % label,
           ref_af is not None and got is not None and got.tobytes() == ref_af.tobytes() and
           got.tobytes() != ref.tobytes(), show(r0) + " | " + show(r1))
    bad = [("freq_base_swa other than freq_base",
            [("gpt-oss.rope.freq_base_swa", "f32", 10000.0)],
            ["gpt-oss.rope.freq_base_swa", "freq_base"]),
           ("a swiglu limit key", [("gpt-oss.swiglu_clamp_exp", "f32", 7.0)],
            ["gpt-oss.swiglu_clamp_exp", "refused"])]
    for i, (name, extra, needles) in enumerate(bad):
        path = os.path.join(tmp, "gpt-oss-bad-%d.gguf" % i)
        write(path, cfg, tensors, gptoss_kvs(cfg, extra))
        r = H.run([shoal, "run", path] + ARGS, timeout=60)
        lines = (r.stderr or "").strip().splitlines()
        result("bad gpt-oss GGUF (%s): exit 2, one line naming %s" % (name, ", ".join(needles)),
               r.returncode == 2 and len(lines) == 1 and all(n in lines[0] for n in needles),
               show(r))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--keep", metavar="DIR", help="write the checkpoints and GGUF files into "
                    "DIR (empty or new) and keep them (bench/gguf_agree.py --files reads them)")
    a = ap.parse_args()
    shoal = os.path.abspath(a.shoal)
    specs = sorted({c[0] for c in CASES.values()} | {"gpt_oss", "gpt_oss_bf16", "gpt_oss_mxfp4"})
    if a.keep:
        os.makedirs(a.keep, exist_ok=True)
        if os.listdir(a.keep):
            sys.exit("test_gguf_arch: --keep %s is not empty" % a.keep)
    with (contextlib.nullcontext(a.keep) if a.keep else
          tempfile.TemporaryDirectory(prefix="shoal-gguf-arch-")) as tmp:
        man, _ = gen_tiny.generate(os.path.join(tmp, "ckpt"), only=specs, verbose=False)
        split_ds = None
        for label, (spec, make_kvs, split) in CASES.items():
            m = man["models"].get(spec, {})
            if "seed" not in m:
                result("%s: gen_tiny wrote %s" % (label, spec), False, json.dumps(m))
                continue
            t, c, ref = check_case(shoal, tmp, label, os.path.join(tmp, "ckpt", spec), make_kvs,
                              split)
            if label == "deepseek2 split":
                split_ds = (t, c)
                if ref is not None:
                    check_f16_kv_b(shoal, tmp, t, c, ref)
                    check_native_kv_b(shoal, tmp, t, c)
        if split_ds:
            check_bad(shoal, tmp, *split_ds)
        check_gptoss(shoal, tmp, os.path.join(tmp, "ckpt"))
    sys.exit(result.summary())


if __name__ == "__main__":
    main()
