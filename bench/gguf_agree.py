#!/usr/bin/python3
"""shoal and llama.cpp on the same GGUF files: perplexity and greedy text
(issue 30, "the same prompt's greedy tokens and perplexity from llama.cpp on
the same file agree with shoal's, perplexity within 0.5 %").

usage: gguf_agree.py --llama-cpp DIR [--shoal PATH] [--work DIR]
                     [--types Q8_0,Q6_K,...] [--chunks N] [--prompts N]
                     [--model GGUF] [--out JSON]

DIR is a llama.cpp source tree with a CPU build in DIR/build/bin
(llama-quantize, llama-imatrix, llama-perplexity, llama-completion); nothing
of llama.cpp is built here. The model is the bundled checkpoint written as a
BF16 GGUF by tests/make_gguf.py (or --model), quantized by llama-quantize to
each type (the IQ1/IQ2/IQ3 types with an importance matrix from
llama-imatrix over the first 200 kB of the training corpus), every file read
by both engines as it is.

For each file:
  perplexity  the held-out Shakespeare text (models/shakespeare-moe/
              heldout.json), windows of 256 tokens, the second half of each
              scored (llama-perplexity's protocol; shoal perplexity
              --score-from 128), the first --chunks windows; the ratio
  greedy      --prompts prompts (the first lines of held-out speeches),
              32 tokens each from both engines (llama-completion --temp 0,
              shoal run --greedy): the tokens they share before the first
              difference of the tokens compared (the shorter text: an end of
              text stops one), and there shoal's logit gap between its pick
              and llama.cpp's (a near tie: two engines that round
              differently may pick either)
--files F.gguf,...: other architectures (deepseek2, gpt-oss, glm4moe, ...):
each file (e.g. those `tests/cli/test_gguf_arch.py --keep DIR` writes from
tiny random checkpoints, as llama.cpp's converter writes them) is scored by
both engines on the held-out text, windows of 128 tokens, the second half
scored. A file without a vocabulary gets a byte-level one (gpt2, 256 byte
tokens, one merge; with DIR's gguf-py) in a copy under --work, and a copy
without trailing MTP layers that lack their attention tensors (llama.cpp
loads an MTP layer's whole decoder layer; the tiny checkpoints hold only
its MTP parts). Perplexity only: greedy text of a random model says little.

Prints a table and writes JSON (--out). Asserts nothing.
"""
import argparse
import json
import os
import re
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import benchlib  # noqa: E402

ROOT = benchlib.ROOT
MODEL = os.path.join(ROOT, "models", "shakespeare-moe")
IMATRIX_TYPES = {"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS"}
N_GEN = 32


def sh(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def heldout_text():
    with open(os.path.join(MODEL, "heldout.json")) as f:
        h = json.load(f)
    with open(h["corpus"], "rb") as f:
        data = f.read()
    return data[h["start"]:h["start"] + h["length"]].decode("utf-8"), h["corpus"]


def prompts(text, n):
    """The first line of the first n speeches of at least 40 characters."""
    out = []
    for block in text.split("\n\n"):
        lines = block.split("\n")
        if len(lines) >= 2 and lines[0].endswith(":") and len(lines[1]) >= 40:
            out.append(lines[0] + "\n" + lines[1])
        if len(out) == n:
            break
    return out


def llama_ppl(a, model, textfile):
    # its running estimate after chunk N ("[N]ppl," on stdout) is the
    # perplexity of the first N chunks; into a pipe the last lines it logs
    # (the final estimate among them) are sometimes lost at exit, so it
    # runs a pass (8 chunks) further
    r = sh([a.bin("llama-perplexity"), "-m", model, "-f", textfile, "-c", "256", "-t",
            str(a.threads), "--chunks", str(a.chunks + 8)])
    m = re.search(r"\[%d\]([0-9.]+)," % a.chunks, r.stdout)
    if r.returncode or not m:
        raise SystemExit("llama-perplexity on %s failed (exit %d): %s" % (
            model, r.returncode, (r.stdout + r.stderr)[-500:]))
    return float(m.group(1))


def shoal_ppl(a, model, textfile):
    r = sh([a.shoal, "perplexity", model, "--file", textfile, "--ctx", "256", "--score-from",
            "128", "--max-windows", str(a.chunks), "--threads", str(a.threads), "--json"])
    if r.returncode:
        raise SystemExit("shoal perplexity on %s failed: %s" % (model, r.stderr[-500:]))
    return json.loads(r.stdout)["perplexity"]


def llama_greedy(a, model, prompt):
    r = sh([a.bin("llama-completion"), "-m", model, "-p", prompt, "-n", str(N_GEN), "--temp",
            "0", "-t", str(a.threads), "-no-cnv", "--no-warmup"])
    if r.returncode or not r.stdout.startswith(prompt):
        raise SystemExit("llama-completion on %s failed: %s" % (model, r.stderr[-500:]))
    return r.stdout[len(prompt):]


def shoal_tokens(a, model, text):
    r = sh([a.shoal, "tokenize", model, "--text", text, "--no-bos"])
    return [int(x) for x in r.stdout.split()]


def greedy(a, model, prompt, work):
    """(shared tokens, tokens compared: the shorter of the two texts, shoal's
    logit gap at the first difference or None)."""
    lg = os.path.join(work, "logits.npy")
    ids = os.path.join(work, "ids.txt")
    r = sh([a.shoal, "run", model, "--prompt", prompt, "--max-tokens", str(N_GEN), "--greedy",
            "--threads", str(a.threads), "--logits-out", lg, "--ids-out", ids])
    if r.returncode:
        raise SystemExit("shoal run on %s failed: %s" % (model, r.stderr[-500:]))
    with open(ids) as f:
        mine = [int(x) for x in f.read().split()]
    theirs_text = llama_greedy(a, model, prompt)
    p = shoal_tokens(a, model, prompt)
    theirs = shoal_tokens(a, model, prompt + theirs_text)[len(p):]
    k = 0
    while k < min(len(mine), len(theirs)) and mine[k] == theirs[k]:
        k += 1
    n = min(len(mine), len(theirs))
    if k >= n:
        return k, n, None
    logits = np.load(lg)
    return k, n, float(logits[k][mine[k]] - logits[k][theirs[k]])


def prepared(a, src):
    """src, or a copy under --work with a byte-level vocabulary and no
    MTP layers that lack their attention tensors (see the docstring)."""
    sys.path.insert(0, os.path.join(a.llama_cpp, "gguf-py"))
    import gguf   # noqa: E402  (llama.cpp's own package)
    r = gguf.GGUFReader(src)
    names = {t.name for t in r.tensors}
    blocks = sorted({int(n.split(".")[1]) for n in names if n.startswith("blk.")})
    drop = [b for b in blocks if "blk.%d.nextn.eh_proj.weight" % b in names and
            "blk.%d.attn_output.weight" % b not in names and
            "blk.%d.attn_kv_a_mqa.weight" % b not in names]
    if "tokenizer.ggml.tokens" in r.fields and not drop:
        return src
    dst = os.path.join(a.work, "v-" + os.path.basename(src))
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if "tokenizer.ggml.tokens" not in r.fields and name.startswith("tokenizer."):
            continue
        t, v = f.types[0], f.contents()
        if drop and name.endswith(".block_count"):
            v -= len(drop)
        if drop and name.endswith(".nextn_predict_layers"):
            continue
        if t == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, v, t, sub_type=f.types[-1])
        else:
            w.add_key_value(name, v, t)
    if "tokenizer.ggml.tokens" not in r.fields:
        n_vocab = next(int(t.shape[1]) for t in r.tensors if t.name == "token_embd.weight")
        # gpt2's byte-to-unicode table: printable bytes as themselves
        keep = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
        extra = iter(range(256, 512))
        byte_char = {b: chr(b if b in keep else next(extra)) for b in range(256)}
        toks = [byte_char[b] for b in range(256)] + ["\u0120\u0120"] + \
               ["[PAD%d]" % i for i in range(n_vocab - 257)]
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt-2")
        w.add_token_list(toks)
        w.add_token_types([1] * 257 + [3] * (n_vocab - 257))
        w.add_token_merges(["\u0120 \u0120"])
        w.add_eos_token_id(n_vocab - 1)
        w.add_bos_token_id(n_vocab - 1)
        w.add_add_bos_token(False)
    for t in r.tensors:
        if any(t.name.startswith("blk.%d." % b) for b in drop):
            continue
        w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def files_mode(a, textfile):
    res = {"llama_cpp": a.llama_cpp, "chunks": a.chunks, "ctx": 128, "rows": []}
    print("%-34s %12s %12s %8s" % ("file", "llama.cpp", "shoal", "ratio"))
    for src in a.files.split(","):
        path = prepared(a, src)
        r = sh([a.bin("llama-perplexity"), "-m", path, "-f", textfile, "-c", "128", "-t",
                str(a.threads), "--chunks", str(a.chunks + 8)])
        m = re.search(r"\[%d\]([0-9.]+)," % a.chunks, r.stdout)
        s = sh([a.shoal, "perplexity", path, "--file", textfile, "--ctx", "128", "--score-from",
                "64", "--max-windows", str(a.chunks), "--threads", str(a.threads), "--json"])
        lp = float(m.group(1)) if m else None
        sp = json.loads(s.stdout)["perplexity"] if s.returncode == 0 else None
        why = "" if m else " llama.cpp: " + next((l.split(": ", 1)[-1] for l in r.stderr.splitlines()
                                                   if "error loading model" in l), "no result")
        if sp is None:
            why += " shoal: " + s.stderr.strip()[-200:]
        res["rows"].append({"file": src, "llama_ppl": lp, "shoal_ppl": sp,
                            "ratio": sp / lp if lp and sp else None, "why": why.strip()})
        print("%-34s %12s %12s %8s%s" % (os.path.basename(src)[:34],
                                          "%.4f" % lp if lp else "-", "%.4f" % sp if sp else "-",
                                          "%.4f" % (sp / lp) if lp and sp else "-", why[:150]))
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-cpp", required=True)
    ap.add_argument("--shoal", default=os.path.join(ROOT, "build", "coordinator", "shoal"))
    ap.add_argument("--work", default="/tmp/shoal-gguf-agree")
    ap.add_argument("--types", default="BF16,Q8_0,Q6_K,Q4_K_M,Q4_0,Q2_K,IQ4_XS,IQ2_XXS,IQ1_S")
    ap.add_argument("--chunks", type=int, default=60)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", help="a BF16 GGUF to start from (default: the bundled "
                    "checkpoint through tests/make_gguf.py)")
    ap.add_argument("--files", help="comma-separated GGUF files of other architectures: "
                    "perplexity only (see the docstring)")
    ap.add_argument("--out")
    a = ap.parse_args()
    a.bin = lambda name: os.path.join(a.llama_cpp, "build", "bin", name)
    os.makedirs(a.work, exist_ok=True)
    text, corpus = heldout_text()
    textfile = os.path.join(a.work, "heldout.txt")
    with open(textfile, "w") as f:
        f.write(text)
    if a.files:
        res = files_mode(a, textfile)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(res, f, indent=1)
        return
    base = a.model or os.path.join(a.work, "shakespeare-bf16.gguf")
    if not a.model and not os.path.exists(base):
        r = sh([sys.executable, os.path.join(ROOT, "tests", "make_gguf.py"), base])
        if r.returncode:
            raise SystemExit(r.stderr)
    imat = os.path.join(a.work, "imatrix.gguf")
    res = {"llama_cpp": a.llama_cpp, "chunks": a.chunks, "n_gen": N_GEN, "rows": []}
    print("%-8s %10s %10s %8s   %s" % ("type", "llama.cpp", "shoal", "ratio",
                                         "greedy: tokens shared/compared (shoal's logit gap "
                                         "at the first difference)"))
    for t in a.types.split(","):
        path = base if t == "BF16" else os.path.join(a.work, "shakespeare-%s.gguf" % t)
        if t != "BF16" and not os.path.exists(path):
            cmd = [a.bin("llama-quantize")]
            if t in IMATRIX_TYPES:
                if not os.path.exists(imat):
                    calib = os.path.join(a.work, "calib.txt")
                    with open(corpus, "rb") as f, open(calib, "wb") as g:
                        g.write(f.read(200000))
                    sh([a.bin("llama-imatrix"), "-m", base, "-f", calib, "-c", "256", "-t",
                        str(a.threads), "-o", imat])
                cmd += ["--imatrix", imat]
            r = sh(cmd + [base, path, t, str(a.threads)])
            if r.returncode:
                raise SystemExit("llama-quantize %s: %s" % (t, r.stderr[-500:]))
        lp, sp = llama_ppl(a, path, textfile), shoal_ppl(a, path, textfile)
        gs = [greedy(a, path, p, a.work) for p in prompts(text, a.prompts)]
        row = {"type": t, "file": path, "llama_ppl": lp, "shoal_ppl": sp, "ratio": sp / lp,
               "greedy": [{"shared": k, "compared": n, "gap": g} for k, n, g in gs]}
        res["rows"].append(row)
        print("%-8s %10.4f %10.4f %8.4f   %s" % (t, lp, sp, sp / lp, " ".join(
            "%d/%d" % (k, n) if g is None else "%d/%d(%.3f)" % (k, n, g) for k, n, g in gs)))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
