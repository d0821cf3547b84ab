#!/usr/bin/python3
"""Self-check of models/shakespeare-moe/tokenizer.json (no torch needed at run
time beyond the import of the training module's helpers).

    /usr/bin/python3 models/check_tokenizer.py

Checks, using only what is in the checkpoint directory:
  - the held-out byte range recorded in heldout.json matches the corpus (sha256)
  - decode(encode(x)) == x for the held-out text, and its token count matches
    heldout.json
  - the golden prompts encode to the prompt_ids recorded in golden/golden.json
  - special tokens are parsed when asked and decode back to their text
"""

import hashlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from train_shakespeare_moe import CORPUS, Tokenizer  # noqa: E402

D = os.path.join(HERE, "shakespeare-moe")


def load_tokenizer(path):
    tj = json.load(open(path, encoding="utf-8"))
    assert tj["model"]["type"] == "BPE" and tj["pre_tokenizer"]["type"] == "ByteLevel"
    inv = sorted(tj["model"]["vocab"].items(), key=lambda kv: kv[1])
    assert [i for _, i in inv] == list(range(len(inv))), "vocab ids are not 0..n-1"
    merges = [tuple(m.split(" ")) for m in tj["model"]["merges"]]
    specials = sorted(tj["added_tokens"], key=lambda t: t["id"])
    assert [t["id"] for t in specials] == list(range(len(inv), len(inv) + len(specials)))
    return Tokenizer([s for s, _ in inv], merges, [t["content"] for t in specials])


def main():
    tok = load_tokenizer(os.path.join(D, "tokenizer.json"))
    ho = json.load(open(os.path.join(D, "heldout.json")))
    data = open(CORPUS, "rb").read()
    held_b = data[ho["start"]:ho["start"] + ho["length"]]
    assert ho["start"] + ho["length"] == len(data)
    assert hashlib.sha256(held_b).hexdigest() == ho["sha256"], "held-out sha256 mismatch"
    text = held_b.decode("utf-8")
    ids = tok.encode(text)
    assert tok.decode(ids) == text, "round-trip failed"
    assert len(ids) == ho["n_tokens"], (len(ids), ho["n_tokens"])
    print("held-out: %d bytes -> %d tokens, decode(encode(x)) == x: OK" % (len(held_b), len(ids)))

    golden = json.load(open(os.path.join(D, "golden", "golden.json"), encoding="utf-8"))
    for p in golden["prompts"]:
        got = tok.encode(p["prompt"])
        assert got == p["prompt_ids"], (p["prompt"], got, p["prompt_ids"])
        print("prompt %r -> %s %s OK" % (p["prompt"], got, [tok.vocab[i] for i in got]))

    chat = "<|im_start|>user\nSpeak, speak.<|im_end|>\n<|im_start|>assistant\n"
    cids = tok.encode(chat, parse_special=True)
    assert tok.decode(cids) == chat
    assert cids[0] == tok.tok2id["<|im_start|>"]
    print("chat %r -> %s OK" % (chat, cids))
    for s in ("héllo wörld ½ ²³ \u3000x\t\ty  \n\n  z", "don't we'll I'M 12345 ...!!", ""):
        assert tok.decode(tok.encode(s)) == s
    print("all tokenizer checks passed")


if __name__ == "__main__":
    main()
