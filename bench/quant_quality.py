#!/usr/bin/env python3
"""Perplexity of the bundled model's held-out split for each precision.

Converts models/shakespeare-moe into containers (experts and dense at f32,
bf16, int8 and int4 with groups 32/64/128) and runs `shoal perplexity` on
the held-out text the training script never saw. Prints a markdown table
(the one in docs/QUANTIZATION.md) with loss, perplexity, the change against
the bf16 checkpoint, and the container sizes.

Usage: /usr/bin/python3 bench/quant_quality.py --shoal build/coordinator/shoal [--out DIR]
Needs ../shared/data/corpus/tinyshakespeare.txt.
"""
import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "models", "shakespeare-moe")
CORPUS = os.path.join(os.path.dirname(ROOT), "shared", "data", "corpus", "tinyshakespeare.txt")

CONFIGS = [
    ("HF checkpoint (bf16)", None),
    ("f32 / f32", ["--experts", "f32", "--dense", "f32"]),
    ("bf16 / bf16", ["--experts", "bf16", "--dense", "bf16"]),
    ("int8 g32 / int8", ["--experts", "int8", "--dense", "int8", "--group", "32"]),
    ("int8 g64 / int8", ["--experts", "int8", "--dense", "int8", "--group", "64"]),
    ("int8 g128 / int8", ["--experts", "int8", "--dense", "int8", "--group", "128"]),
    ("int4 g32 / bf16", ["--experts", "int4", "--dense", "bf16", "--group", "32"]),
    ("int4 g64 / bf16", ["--experts", "int4", "--dense", "bf16", "--group", "64"]),
    ("int4 g128 / bf16", ["--experts", "int4", "--dense", "bf16", "--group", "128"]),
    ("int4 g32 / int8", ["--experts", "int4", "--dense", "int8", "--group", "32"]),
    ("int4a8 g32 / bf16", ["--experts", "int4a8", "--dense", "bf16", "--group", "32"]),
    ("int4a8 g64 / bf16", ["--experts", "int4a8", "--dense", "bf16", "--group", "64"]),
    ("int4a8 g128 / bf16", ["--experts", "int4a8", "--dense", "bf16", "--group", "128"]),
    ("int4a8 g32 / int4a8 trunk", ["--experts", "int4a8", "--dense", "int4a8", "--group", "32"]),
    ("int4a8 g64 / int4a8 trunk", ["--experts", "int4a8", "--dense", "int4a8", "--group", "64"]),
    ("int4 g64 / int4 trunk", ["--experts", "int4", "--dense", "int4", "--group", "64"]),
]


def du(path):
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", default=None,
                    help="run only the rows whose name contains this text (and the checkpoint)")
    a = ap.parse_args()
    if not os.path.exists(CORPUS):
        print("SKIP: %s not found" % CORPUS)
        return 0
    h = json.load(open(os.path.join(MODEL, "heldout.json")))
    held = open(CORPUS, "rb").read()[h["start"]:h["start"] + h["length"]]
    assert hashlib.sha256(held).hexdigest() == h["sha256"], "held-out split differs"
    tmp = a.out or tempfile.mkdtemp(prefix="shoal-quant-")
    text = os.path.join(tmp, "heldout.txt")
    open(text, "wb").write(held)
    rows = []
    base = None
    for name, flags in CONFIGS:
        if a.only and flags and a.only not in name:
            continue
        path = MODEL
        size = sum(os.path.getsize(os.path.join(MODEL, f)) for f in os.listdir(MODEL)
                   if f.endswith(".safetensors"))
        if flags:
            path = os.path.join(tmp, name.replace(" ", "_").replace("/", "-"))
            subprocess.run([a.shoal, "convert", MODEL, path, "--force"] + flags, check=True,
                           capture_output=True)
            size = os.path.getsize(os.path.join(path, "dense.bin")) + \
                os.path.getsize(os.path.join(path, "experts.bin")) - 2 * 4096
        r = subprocess.run([a.shoal, "perplexity", "--model", path, "--file", text, "--ctx",
                            str(h["window"]), "--json"], capture_output=True, text=True, check=True)
        res = json.loads(r.stdout)
        if base is None:
            base = res["loss"]
        rows.append((name, res["loss"], res["perplexity"], size))
        print("%-24s loss %.5f ppl %.4f" % (name, res["loss"], res["perplexity"]), file=sys.stderr)
    print("| experts / dense | held-out loss | perplexity | Δ ppl vs checkpoint | weight bytes |")
    print("|---|---|---|---|---|")
    for name, loss, ppl, size in rows:
        print("| %s | %.5f | %.4f | %+.2f%% | %.2f MB |" % (
            name, loss, ppl, 100 * (ppl / math.exp(base) - 1), size / 1e6))
    print("\nTraining script's held-out loss (bf16 weights, torch): %.5f, perplexity %.4f; "
          "%d windows of %d tokens, %d predictions." % (h["loss"], h["perplexity"], h["n_windows"],
                                                         h["window"], h["n_predictions"]))
    if not a.out:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
