#!/usr/bin/python3
"""The numpy reference behind the `shoal run` CLI contract (self-test stand-in).

Used to self-test the harnesses (test_reference.py / test_bad_input.py) without
the C engine:

    /usr/bin/python3 tests/reference/test_reference.py --shoal tests/reference/ref_cli.py
    /usr/bin/python3 tests/reference/test_bad_input.py --shoal tests/reference/ref_cli.py

Implements only the part of the contract those tests rely on:
    ref_cli.py run --model DIR --tokens 1,2,3 --max-tokens N --greedy
                   [--ctx N] [--logits-out F.npy] [--ids-out F.txt]
    ref_cli.py convert SRC DST   (loads SRC, writes nothing)
--logits-out: float32 .npy [steps][vocab] (row 0 = after the prompt, row i =
after feeding generated token i-1); --ids-out: one line of space-separated ids.
Errors: one line on stderr, exit status 2.
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_numpy as R  # noqa: E402


def die(msg):
    sys.stderr.write("shoal: error: " + msg.replace("\n", " ") + "\n")
    sys.exit(2)


def convert(argv):
    """Stand-in for `shoal convert SRC DST`: loads SRC as the reference would
    (config + every tensor checked) and writes nothing; exit 0 if it loads."""
    if len(argv) != 2:
        die("usage: shoal convert SRC DST")
    try:
        R.load_model(argv[0])
    except R.CheckpointError as e:
        die(str(e))


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "convert":
        return convert(sys.argv[2:])
    if len(sys.argv) < 2 or sys.argv[1] != "run":
        die("usage: shoal run --model DIR --tokens IDS --max-tokens N --greedy")
    ap = argparse.ArgumentParser(prog="shoal run")
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--greedy", action="store_true")
    ap.add_argument("--ctx", type=int, default=None)
    ap.add_argument("--logits-out")
    ap.add_argument("--ids-out")
    a = ap.parse_args(sys.argv[2:])
    try:
        prompt = [int(x) for x in a.tokens.split(",") if x != ""]
    except ValueError:
        die(f"--tokens: not a comma-separated list of integers: {a.tokens!r}")
    try:
        m = R.load_model(a.model)
        ctx = a.ctx if a.ctx is not None else m.c["max_position_embeddings"]
        if len(prompt) > ctx:
            die(f"prompt of {len(prompt)} tokens exceeds the context size (--ctx {ctx})")
        n = min(a.max_tokens, ctx - len(prompt))
        ids, lg = R.greedy(m, prompt, n)
    except R.CheckpointError as e:
        die(str(e))
    if a.logits_out:
        np.save(a.logits_out, lg.astype(np.float32))
    if a.ids_out:
        with open(a.ids_out, "w") as f:
            f.write(" ".join(map(str, ids)) + "\n")
    print(" ".join(map(str, ids)))


if __name__ == "__main__":
    main()
