#!/usr/bin/python3
"""`shoal convert FILE.gguf DST` (issue 30): a container that keeps every
tensor's GGUF type (dtype GGML with its ggml_type, docs/FORMAT.md "GGML
tensors"), and runs with the GGUF's own logits bytes.

usage: /usr/bin/python3 tests/cli/test_gguf_convert.py --shoal build-test/coordinator/shoal

The files are the ones the GGUF tests write (test_run_gguf.py's writer and
quantizers on the bundled checkpoint, test_gguf_arch.py's deepseek2 and
gpt-oss files on gen_tiny checkpoints).

Cases:
  k-mix:    trunk Q6_K, experts' gate/up Q4_K in even layers and Q6_K in odd
            ones (each layer's blob its own size), down Q8_0, the file's
            vocabulary and a chat template: DST's 16 greedy steps are the
            GGUF's logits bytes (--tokens and --prompt), its manifest records
            each tensor's ggml type, inspect prints the GGUF's types per
            group, --verify passes, 'shoal template' renders the same prompt
  iq-mix:   random IQ2_XXS/IQ3_XXS/IQ1_S experts (MXFP4/IQ4_NL down): bytes
  gpt-oss:  MXFP4 experts with F32 biases (six components): bytes, also
            through a 1 MB cache
  deepseek2: V3 as llama.cpp writes it (attn_k_b/attn_v_b, a leading dense
            layer, F32): bytes
  split:    the k-mix as a set of two files, converted from the second: bytes
  requantize: --experts int8 records INT8 experts (the trunk keeps its
            ggml types), --dense bf16 BF16 matrices; both run, near the GGUF
  mirror:   DST with --mirror (a copy of experts.bin): bytes, both sources read
  shard:    'shoal shard FILE.gguf --shards 2' (OUT/model + two shards) served
            by two shoal-workers to a coordinator on OUT/model without local
            experts: the GGUF's bytes, both workers used; 'shoal shard DST'
            works too
  bad:      a truncated GGUF and one with a NaN block scale in an expert:
            exit 2, one line naming the file, no DST (nor its temporary)
Ends with "N passed, M failed"; exit status 1 if anything failed.
"""

import argparse
import glob
import json
import os
import re
import shutil
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "reference"))
import harness as H  # noqa: E402
import test_run_gguf as W  # noqa: E402  (the writer, quantizers, checkpoint's tensors)
import test_gguf_arch as A  # noqa: E402  (deepseek2 and gpt-oss files)
import test_gguf_stream as S  # noqa: E402  (split sets' u16 keys)
import gen_tiny  # noqa: E402

result = H.Results()
TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}" \
           "{% if add_generation_prompt %}<|assistant|>{% endif %}"


def run(shoal, model, out, *extra, args=None):
    r = H.run([shoal, "run", model] + (args or W.ARGS) + ["--logits-out", out] + list(extra),
              timeout=120)
    return r, (np.load(out) if r.returncode == 0 and os.path.exists(out) else None)


def convert(shoal, src, dst, *extra):
    return H.run([shoal, "convert", src, dst] + list(extra), timeout=300)


def manifest(dst):
    with open(os.path.join(dst, "shoal.json")) as f:
        return json.load(f)


def same_run(shoal, tmp, label, gguf, dst, *extra, args=None):
    """The GGUF's run and DST's: the same logits bytes."""
    r0, a = run(shoal, gguf, os.path.join(tmp, label + "-gguf.npy"), *extra, args=args)
    r1, b = run(shoal, dst, os.path.join(tmp, label + "-dst.npy"), *extra, args=args)
    return result("%s: the converted container's logits are the GGUF's bytes%s" %
                  (label, " (%s)" % " ".join(extra) if extra else ""),
                  W.same_bytes(a, b), W.show(r0) + " | " + W.show(r1)), a


def kmix(tensors):
    """Trunk Q6_K, experts' gate/up Q4_K (even layers) or Q6_K (odd), down Q8_0."""
    out = []
    for n, x, t in W.typed(tensors, matrix_type="Q6_K", expert_type="Q4_K"):
        if "ffn_down_exps" in n:
            t = "Q8_0"
        elif "_exps." in n and int(n.split(".")[1]) % 2:
            t = "Q6_K"
        out.append((n, x, t))
    return out


def group_types(text, name):
    """[(type, count)] of the inspect line of group `name`."""
    for line in text.splitlines():
        if re.match(r"\s*%s\s{2,}" % re.escape(name), line):
            return sorted(re.findall(r"(\w+) x(\d+)", line))
    return []


def test_kmix(shoal, tmp, tensors, kvs):
    path = os.path.join(tmp, "kmix.gguf")
    typed = kmix(tensors)
    W.write_gguf(path, kvs + W.vocab_kvs() + [W.kv("tokenizer.chat_template", "str", TEMPLATE)],
                 typed)
    dst = os.path.join(tmp, "kmix")
    r = convert(shoal, path, dst)
    if not result("k-mix: convert exits 0", r.returncode == 0, W.show(r)):
        return None, None
    same_run(shoal, tmp, "k-mix", path, dst)
    same_run(shoal, tmp, "k-mix --prompt (the file's vocabulary, as tokenizer.gguf)", path, dst,
             args=["--prompt", "ROMEO:", "--max-tokens", "16", "--greedy"])
    m = manifest(dst)
    want = {n: t for n, x, t in typed}
    dense = {t["name"]: t for t in m["dense"]["tensors"]}
    e = m["experts"]
    layers = {l["layer"]: l for l in e["layers"]}
    comp_types = [[(c["dtype"], c.get("ggml_type")) for c in layers[il]["components"]]
                  for il in sorted(layers)]
    want_comp = [[("GGML", want["blk.%d.ffn_%s_exps.weight" % (il, c)])
                  for c in ("gate", "up", "down")] for il in sorted(layers)]
    ok = e["dtype"] == "GGML" and comp_types == want_comp and \
        dense["blk.0.attn_q"]["dtype"] == "GGML" and \
        dense["blk.0.attn_q"]["ggml_type"] == want["blk.0.attn_q.weight"] and \
        dense["tok_embd"].get("ggml_type") == "Q6_K" and dense["out_norm"]["dtype"] == "F32"
    blobs = sorted({l["blob_bytes"] for l in layers.values()})
    result("k-mix: the manifest keeps each tensor's type (experts GGML, per layer %s), "
           "each layer its own blob (%s bytes)" % (comp_types[:2], blobs),
           ok and len(blobs) == 2 and e["blob_bytes"] == blobs[-1] and
           all(b % 4096 == 0 for b in blobs), json.dumps(comp_types))
    gi = H.run([shoal, "inspect", path])
    ci = H.run([shoal, "inspect", dst, "--verify"])
    pairs = (("token_embd", "token_embd"), ("attention (attn_*)", "attention"),
             ("router (ffn_gate_inp)", "router"), ("routed experts (ffn_*_exps)",
                                                   "routed experts"), ("norms", "norms"))
    gtypes = {cn: group_types(gi.stdout, gn) for gn, cn in pairs}
    ctypes = {cn: group_types(ci.stdout, cn) for gn, cn in pairs}
    result("k-mix: inspect DST prints the GGUF's types per group (%s)" % ctypes["routed experts"],
           ci.returncode == 0 and all(gtypes[k] == ctypes[k] and ctypes[k] for k in ctypes),
           "%s vs %s" % (gtypes, ctypes))
    result("k-mix: inspect --verify checks every checksum", "verify       ok" in ci.stdout,
           ci.stdout[-300:] + ci.stderr[-300:])
    t = H.run([shoal, "template", dst, "--user", "hi", "--add-generation-prompt"])
    result("k-mix: shoal template renders the GGUF's tokenizer.chat_template from DST",
           t.returncode == 0 and t.stdout == "<|user|>hi\n<|assistant|>",
           "%r %s" % (t.stdout, t.stderr[-200:]))
    return path, dst


def test_iq(shoal, tmp, tensors, kvs):
    rng = np.random.default_rng(3030)
    label, gate_up, down = W.MIXES[1]
    typed = []
    for n, x, t in W.typed(tensors, matrix_type="BF16"):
        if "_exps." in n:
            il = int(n.split(".")[1])
            t = down[il % 2] if "ffn_down_exps" in n else gate_up[il % len(gate_up)]
            x = (x, W.random_blocks(t, x, rng)[0])
        typed.append((n, x, t))
    path, dst = os.path.join(tmp, "iq.gguf"), os.path.join(tmp, "iq")
    W.write_gguf(path, kvs, typed)
    r = convert(shoal, path, dst)
    if result("%s (%s): convert exits 0" % (label, ", ".join(gate_up + down)), r.returncode == 0,
              W.show(r)):
        same_run(shoal, tmp, label, path, dst)


def test_arch(shoal, tmp):
    ck = os.path.join(tmp, "ckpt")
    gen_tiny.generate(ck, only=["deepseek_v3", "gpt_oss_mxfp4"], verbose=False)
    # deepseek2 (V3) as the converter writes it today: split attn_k_b / attn_v_b
    d = os.path.join(ck, "deepseek_v3")
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    st = {}
    for fn in sorted(os.listdir(d)):
        if fn.endswith(".safetensors"):
            st.update(W.read_safetensors(os.path.join(d, fn)))
    path = os.path.join(tmp, "deepseek2.gguf")
    A.write(path, cfg, A.gguf_tensors(st, cfg, True), A.deepseek2_kvs(cfg, True))
    dst = os.path.join(tmp, "deepseek2")
    r = convert(shoal, path, dst)
    if result("deepseek2 (V3, split attn_k_b/attn_v_b, a dense layer): convert exits 0",
              r.returncode == 0, W.show(r)):
        same_run(shoal, tmp, "deepseek2", path, dst, args=A.ARGS)
    # gpt-oss: MXFP4 experts and their F32 biases
    g = os.path.join(tmp, "gpt_oss_mxfp4-7")
    cfg, st = A.gptoss_checkpoint(os.path.join(ck, "gpt_oss_mxfp4"), g, 7.0, True)
    tensors = A.gptoss_tensors(st)
    path = os.path.join(tmp, "gpt-oss.gguf")
    A.write(path, cfg, tensors, A.gptoss_kvs(cfg), A.gptoss_types(tensors, "BF16"))
    dst = os.path.join(tmp, "gpt-oss")
    r = convert(shoal, path, dst)
    if result("gpt-oss MXFP4: convert exits 0", r.returncode == 0, W.show(r)):
        comps = manifest(dst)["experts"]["layers"][0]["components"]
        result("gpt-oss: six components, the weights GGML MXFP4, the biases F32",
               [c.get("ggml_type", c["dtype"]) for c in comps] == ["MXFP4"] * 3 + ["F32"] * 3,
               json.dumps(comps))
        same_run(shoal, tmp, "gpt-oss MXFP4", path, dst, args=A.ARGS)
        same_run(shoal, tmp, "gpt-oss MXFP4", path, dst, "--expert-cache", "1MB", args=A.ARGS)


def test_split(shoal, tmp, kvs, typed, ref_path):
    first = [t for t in typed if not t[0].startswith("blk.") or int(t[0].split(".")[1]) < 2]
    second = [t for t in typed if t not in first]
    sdir = os.path.join(tmp, "split")
    os.makedirs(sdir)
    for i, part in enumerate((first, second)):
        extra = [S.u16("split.no", i), S.u16("split.count", 2)]
        if i == 0:
            extra.append(W.kv("split.tensors.count", "i32", len(typed)))
        W.write_gguf(os.path.join(sdir, "m-%05d-of-00002.gguf" % (i + 1)),
                     (kvs if i == 0 else []) + extra, part)
    dst = os.path.join(tmp, "split-c")
    r = convert(shoal, os.path.join(sdir, "m-00002-of-00002.gguf"), dst)
    if result("split set: convert from file 2 of 2 exits 0", r.returncode == 0, W.show(r)):
        same_run(shoal, tmp, "split set", ref_path, dst)


def test_requantize(shoal, tmp, path, ref):
    for flags, want_e, dense_name, want_d in ((["--experts", "int8"], "INT8", "blk.0.attn_q",
                                               "GGML"),
                                              (["--dense", "bf16"], "GGML", "blk.0.attn_q",
                                               "BF16")):
        dst = os.path.join(tmp, "rq-" + flags[1])
        r = convert(shoal, path, dst, *flags)
        if not result("requantize %s: convert exits 0" % " ".join(flags), r.returncode == 0,
                      W.show(r)):
            continue
        m = manifest(dst)
        dense = {t["name"]: t["dtype"] for t in m["dense"]["tensors"]}
        result("requantize %s: experts %s, %s %s recorded" % (" ".join(flags), want_e,
                                                               dense_name, want_d),
               m["experts"]["dtype"] == want_e and dense[dense_name] == want_d,
               "%s %s" % (m["experts"]["dtype"], dense[dense_name]))
        r, got = run(shoal, dst, os.path.join(tmp, "rq-%s.npy" % flags[1]))
        cos = W.cosines(got[:1], ref[:1]) if got is not None and ref is not None else [0]
        result("requantize %s: runs, the first step within cosine 0.98 of the GGUF's (%.5f), "
               "not its bytes" % (" ".join(flags), min(cos)),
               got is not None and min(cos) > 0.98 and got.tobytes() != ref.tobytes(), W.show(r))


def test_mirror(shoal, tmp, dst, ref):
    mir = os.path.join(tmp, "mirror")
    os.makedirs(mir)
    shutil.copy(os.path.join(dst, "experts.bin"), mir)
    r, got = run(shoal, dst, os.path.join(tmp, "mirror.npy"), "--mirror", mir, "--stats",
                 "--expert-cache", "1MB")
    reads = re.findall(r"experts: source \d \S+: weight [\d.]+, (\d+) reads", r.stderr)
    result("mirror: DST with --mirror gives the GGUF's bytes, both sources read (%s)" % reads,
           W.same_bytes(got, ref) and len(reads) == 2 and all(int(x) > 0 for x in reads),
           W.show(r))


def test_shard(shoal, tmp, path, dst, ref):
    worker_bin = os.path.join(os.path.dirname(os.path.dirname(shoal)), "worker", "shoal-worker")
    out = os.path.join(tmp, "sharded")
    r = H.run([shoal, "shard", path, "--shards", "2", "--out", out], timeout=300)
    if not result("shard FILE.gguf --shards 2: OUT/model and two shards",
                  r.returncode == 0 and all(os.path.isdir(os.path.join(out, d)) for d in
                                            ("model", "worker-0", "worker-1")), W.show(r)):
        return
    ws = [H.Worker(worker_bin, tmp, "w%d" % i, os.path.join(out, "worker-%d" % i))
          for i in range(2)]
    try:
        addrs = [w.wait_ready() for w in ws]
        if result("two shoal-workers serve the shards", all(addrs),
                  " | ".join(w.text()[-300:] for w in ws)):
            r, got = run(shoal, os.path.join(out, "model"), os.path.join(tmp, "sh.npy"),
                         "--workers", ",".join(addrs), "--local-experts", "off", "--control",
                         "off", "--stats")
            used = re.findall(r"executor \d+ \S+: up, \d+ experts, (\d+) requests", r.stderr)
            result("2 workers on the shards, no local experts: the GGUF's logits bytes, both "
                   "used (%s requests)" % used,
                   W.same_bytes(got, ref) and len(used) == 2 and all(int(u) > 0 for u in used),
                   W.show(r))
    finally:
        for w in ws:
            w.stop()
    r = H.run([shoal, "shard", dst, "--shards", "2", "--out", os.path.join(tmp, "sharded2")])
    sizes = [os.path.getsize(os.path.join(tmp, "sharded2", "worker-%d" % i, "experts.bin"))
             for i in range(2)] if r.returncode == 0 else []
    full = os.path.getsize(os.path.join(dst, "experts.bin"))
    result("shard DST: the shards' experts add up to the container's (%s of %d bytes)" %
           (sizes, full), r.returncode == 0 and sum(sizes) == full + 4096, W.show(r))


def test_bad(shoal, tmp, path, kvs, typed):
    cut = os.path.join(tmp, "cut.gguf")
    with open(path, "rb") as f:
        data = f.read()
    with open(cut, "wb") as f:
        f.write(data[:len(data) // 2])
    nan = os.path.join(tmp, "nan.gguf")
    # expert 1 of layer 0's down (Q8_0 blocks of 34 bytes, 256 rows x 6 blocks): d = NaN
    W.write_gguf(nan, kvs, typed, poison={"blk.0.ffn_down_exps.weight": (256 * 6 * 34, 0x7E00)})
    for label, src, what in (("a truncated GGUF", cut, (cut,)),
                             ("a NaN block scale in an expert", nan,
                              (nan, "'blk.0.ffn_down_exps.weight'", "in expert 1"))):
        dst = os.path.join(tmp, "bad-" + os.path.basename(src))
        r = convert(shoal, src, dst)
        lines = [l for l in r.stderr.splitlines() if l.strip()]
        left = glob.glob(dst + "*")
        result("convert of %s: exit 2, one line naming it, no DST left (%s)" % (label, left),
               r.returncode == 2 and len(lines) == 1 and all(w in lines[0] for w in what) and
               not left,
               W.show(r))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shoal", required=True, help="the shoal binary")
    shoal = os.path.abspath(ap.parse_args().shoal)
    cfg, _, tensors = W.checkpoint()
    kvs = W.metadata(cfg)
    with tempfile.TemporaryDirectory(prefix="shoal-gguf-convert-") as tmp:
        path, dst = test_kmix(shoal, tmp, tensors, kvs)
        test_iq(shoal, tmp, tensors, kvs)
        test_arch(shoal, tmp)
        if path:
            r, ref = run(shoal, path, os.path.join(tmp, "ref.npy"))
            test_split(shoal, tmp, kvs, kmix(tensors), path)
            test_requantize(shoal, tmp, path, ref)
            test_mirror(shoal, tmp, dst, ref)
            test_shard(shoal, tmp, path, dst, ref)
        test_bad(shoal, tmp, path or os.path.join(tmp, "kmix.gguf"), kvs, kmix(tensors))
    sys.exit(result.summary())


if __name__ == "__main__":
    main()
