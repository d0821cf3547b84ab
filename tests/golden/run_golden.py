#!/usr/bin/env python3
"""Golden tests of the bundled model (models/shakespeare-moe).

1. For each golden prompt written by models/train_shakespeare_moe.py, run
   `shoal run --greedy` and require the exact generated token ids and logits
   within 1e-3 x max|logit| at every step (bf16 weights, f32 compute).
2. `shoal perplexity` on the held-out split agrees with the training
   script's held-out loss within 1% (needs ../shared/data/corpus; skipped
   with a message when absent).
3. `shoal chat` driven through a pipe: two turns, /reset, /quit.
4. The MTP head (model.layers.4, models/train_mtp_head.py): the numpy
   reference's MTP logits (tests/reference/ref_numpy.py mtp_logits) on
   golden/mtp.json's held-out window equal the training script's
   golden/mtp.logits.npy; shoal's --draft-logits-out rows after a greedy run
   equal the reference's over that run; --speculate mtp and auto give the
   tokens and logits bytes of --speculate off, greedy and seeded sampling.

Usage: /usr/bin/python3 tests/golden/run_golden.py --shoal build/coordinator/shoal
Prints "N passed, M failed" last; exits non-zero on any failure.
"""
import argparse
import functools
import hashlib
import json
import os
import re
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness as H  # noqa: E402
MODEL = os.path.join(ROOT, "models", "shakespeare-moe")


result = H.Results(skips=True)


run = functools.partial(H.run, timeout=600)   # output captured


def test_golden(shoal, tmp):
    with open(os.path.join(MODEL, "golden", "golden.json"), encoding="utf-8") as f:
        golden = json.load(f)
    n = golden["n_generated"]
    for p in golden["prompts"]:
        name = "golden/" + p["name"]
        # the tokenizer agrees with the training script's
        r = run([shoal, "tokenize", "--model", MODEL, "--no-bos", "--text", p["prompt"]])
        got_ids = [int(x) for x in r.stdout.split()] if r.returncode == 0 else None
        result(name + " tokenize", got_ids == p["prompt_ids"],
               "" if got_ids == p["prompt_ids"] else "got %s want %s %s" % (got_ids, p["prompt_ids"], r.stderr.strip()))
        lo = os.path.join(tmp, p["name"] + ".npy")
        io = os.path.join(tmp, p["name"] + ".ids")
        r = run([shoal, "run", "--model", MODEL, "--tokens", ",".join(map(str, p["prompt_ids"])),
                 "--greedy", "--ignore-eos", "--max-tokens", str(n), "--logits-out", lo, "--ids-out", io])
        if r.returncode != 0:
            result(name + " run", False, r.stderr.strip())
            continue
        ids = [int(x) for x in open(io).read().split()]
        result(name + " tokens", ids == p["generated_ids"],
               "" if ids == p["generated_ids"] else "got %s want %s" % (ids, p["generated_ids"]))
        want = np.load(os.path.join(MODEL, "golden", p["logits_file"]))
        got = np.load(lo)
        if got.shape != want.shape:
            result(name + " logits", False, "shape %s want %s" % (got.shape, want.shape))
            continue
        worst = max(float(np.abs(got[i] - want[i]).max() / np.abs(want[i]).max()) for i in range(n))
        result(name + " logits", worst <= 1e-3, "max |dlogit|/max|logit| = %.2e" % worst)


def test_perplexity(shoal, tmp):
    corpus = H.shared_or_skip("perplexity", "data", "corpus", "tinyshakespeare.txt",
                              results=result)
    if corpus is None:
        return
    with open(os.path.join(MODEL, "heldout.json"), encoding="utf-8") as f:
        h = json.load(f)
    data = open(corpus, "rb").read()
    held = data[h["start"]:h["start"] + h["length"]]
    if hashlib.sha256(held).hexdigest() != h["sha256"]:
        result("perplexity held-out split", False, "sha256 of the held-out bytes differs")
        return
    path = os.path.join(tmp, "heldout.txt")
    open(path, "wb").write(held)
    r = run([shoal, "perplexity", "--model", MODEL, "--file", path, "--ctx", str(h["window"]), "--json"])
    if r.returncode != 0:
        result("perplexity", False, r.stderr.strip())
        return
    got = json.loads(r.stdout)
    rel = abs(got["loss"] - h["loss"]) / h["loss"]
    result("perplexity held-out loss", rel <= 0.01 and got["n_predictions"] == h["n_predictions"],
           "shoal %.5f vs training script %.5f (%.3f%%), %d vs %d predictions, ppl %.3f"
           % (got["loss"], h["loss"], 100 * rel, got["n_predictions"], h["n_predictions"], got["perplexity"]))


def test_chat(shoal):
    script = "Good morrow, sir.\nWhat news?\n/reset\nSpeak again.\n/quit\n"
    r = run([shoal, "chat", "--model", MODEL, "--greedy", "--max-tokens", "12", "-v"], input=script)
    ok = r.returncode == 0 and "(conversation reset)" in r.stdout and len(r.stdout.strip()) > 30
    result("chat piped session", ok, "" if ok else "rc=%d out=%r err=%r" % (r.returncode, r.stdout[-300:], r.stderr[-300:]))
    # KV cache reuse: the second turn prefills only its new tokens; after
    # /reset nothing is reused
    turns = re.findall(r"turn prefilled (\d+) new tokens \((\d+) reused", r.stderr)
    turns = [(int(a), int(b)) for a, b in turns]
    ok = len(turns) == 3 and turns[0][1] == 0 and turns[1][1] > turns[1][0] and turns[2][1] == 0
    result("chat reuses the KV cache across turns", ok, "turns (new, reused): %s" % turns)


def test_mtp(shoal, tmp):
    sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
    import ref_numpy as R
    m = R.load_model(MODEL)
    with open(os.path.join(MODEL, "golden", "mtp.json"), encoding="utf-8") as f:
        g = json.load(f)
    want = np.load(os.path.join(MODEL, "golden", "mtp.logits.npy"))
    got = R.mtp_logits(m, g["ids"])[:want.shape[0]]
    rel = float((np.abs(got - want).max(1) / np.abs(want).max(1)).max())
    result("mtp: the reference's MTP logits = the training script's golden", rel <= 1e-4,
           "max rel diff %.2e over %d rows" % (rel, want.shape[0]))
    prompt = [813, 58]   # "ROMEO:"
    d, io = os.path.join(tmp, "draft.npy"), os.path.join(tmp, "draft.ids")
    r = run([shoal, "run", "--model", MODEL, "--tokens", ",".join(map(str, prompt)), "--greedy",
             "--ignore-eos", "--max-tokens", "24", "--draft-logits-out", d, "--ids-out", io])
    if r.returncode != 0:
        result("mtp: --draft-logits-out", False, r.stderr.strip())
        return
    ids = [int(x) for x in open(io).read().split()]
    eng = np.load(d)
    ref = R.mtp_logits(m, prompt + ids)[len(prompt) - 1:][:eng.shape[0]]
    rel = float((np.abs(eng - ref).max(1) / np.abs(ref).max(1)).max())
    result("mtp: shoal's draft logits = the reference's", eng.shape[0] >= 23 and rel <= 1e-3,
           "%d rows, max rel diff %.2e" % (eng.shape[0], rel))
    for extra in (["--greedy"], ["--temp", "0.9", "--seed", "5"]):
        outs = {}
        for mode in ("off", "mtp", "auto"):
            lo, ii = os.path.join(tmp, mode + ".npy"), os.path.join(tmp, mode + ".ids")
            r = run([shoal, "run", "--model", MODEL, "--tokens", ",".join(map(str, prompt)),
                     "--ignore-eos", "--max-tokens", "60", "--speculate", mode, "--draft-max", "3",
                     "--logits-out", lo, "--ids-out", ii] + extra)
            outs[mode] = (r.returncode, open(lo, "rb").read() if r.returncode == 0 else b"",
                          open(ii).read() if r.returncode == 0 else "", r.stderr)
        kept = re.search(r"speculate mtp: (\d+) drafted, (\d+) kept", outs["mtp"][3])
        result("mtp: --speculate mtp/auto = off, bit for bit (%s)" % " ".join(extra),
               all(o[0] == 0 and o[1] == outs["off"][1] and o[2] == outs["off"][2]
                   for o in outs.values()) and kept and int(kept.group(2)) > 0,
               "drafted/kept %s" % (str(kept.groups()) if kept else outs["mtp"][3].strip()[-200:]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--skip-perplexity", action="store_true",
                    help="skip the held-out perplexity (slow in sanitizer builds)")
    a = ap.parse_args()
    shoal = os.path.abspath(a.shoal)
    with tempfile.TemporaryDirectory() as tmp:
        test_golden(shoal, tmp)
        if a.skip_perplexity:
            print("SKIP perplexity: --skip-perplexity")
        else:
            test_perplexity(shoal, tmp)
        test_chat(shoal)
        test_mtp(shoal, tmp)
    sys.exit(result.summary())


if __name__ == "__main__":
    main()
