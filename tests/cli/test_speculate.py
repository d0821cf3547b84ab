#!/usr/bin/python3
"""Speculative decoding in `shoal run` and `shoal chat` (issue 34): drafts by
prompt lookup, verified in one multi-row step, give the tokens decoding
without drafts gives, bit for bit.

usage: /usr/bin/python3 tests/cli/test_speculate.py --shoal build/coordinator/shoal

Cases, each comparing --speculate off with lookup and auto on the same
command: the streamed text, the --ids-out ids and the --logits-out rows
(every step's f32 logits) are identical
  greedy:    the bundled model's repetitive greedy text (the timings line
             shows drafts kept: the verify path ran, the comparison can fail)
  sampled:   temperature, top-k/p, repetition, presence and frequency
             penalties, a seed; --draft-max 1, 4 and 16
  endings:   a --stop string, the context filling up (--ctx), --max-tokens
             1, 2 and 3
  chat:      two piped turns
  kernels:   an int4a8 container (the int8-activation kernels for 1 row and
             for several) and a Q8_0 GGUF (the ggml kernels); drafts on the
             scalar table against off on this CPU's (--isa scalar)
  flags:     --speculate mtp on a qwen3moe GGUF (no MTP layer) / an unknown mode /
             --draft-max out of range: one
             line, exit 2 (shoal serve's drafts: tests/serve/test_batching.py)
Ends with "N passed, M failed"; exit status 1 if anything failed.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import harness as H  # noqa: E402

result = H.Results()
SPEC = re.compile(r"speculate (\w+): (\d+) drafted, (\d+) kept")


def run(cmd, **kw):
    env = dict(os.environ, OMP_NUM_THREADS="2")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, **kw)


def three_ways(shoal, tmp, name, args, stdin=None, cmd="run", want_kept=False, isa=None):
    """Run args with --speculate off, lookup and auto (lookup and auto with
    --isa isa when given: another kernel table); compare stdout, ids and
    logits with off's. Returns the lookup run's (drafted, kept)."""
    outs = {}
    for mode in ("off", "lookup", "auto"):
        extra = ["--isa", isa] if isa and mode != "off" else []
        if cmd == "run":
            extra += ["--ids-out", os.path.join(tmp, "ids." + mode),
                     "--logits-out", os.path.join(tmp, "lg.%s.npy" % mode)]
        r = run([shoal, cmd] + args + ["--speculate", mode] + extra, input=stdin)
        if r.returncode != 0:
            result("%s: --speculate %s runs" % (name, mode), False,
                   r.stderr.strip()[-400:])
            return None
        files = []
        if cmd == "run":
            for f in ("ids." + mode, "lg.%s.npy" % mode):
                with open(os.path.join(tmp, f), "rb") as fh:
                    files.append(fh.read())
        m = SPEC.search(r.stderr)
        outs[mode] = (r.stdout, files, m)
    base = outs["off"]
    for mode in ("lookup", "auto"):
        same = outs[mode][0] == base[0] and outs[mode][1] == base[1]
        m = outs[mode][2]
        result("%s: --speculate %s gives off's text%s bit for bit" %
               (name, mode, ", ids and logits" if cmd == "run" else ""),
               same and m is not None,
               "" if same else "differs: %r vs %r" % (outs[mode][0][-200:], base[0][-200:]))
    m = outs["lookup"][2]
    got = (int(m.group(2)), int(m.group(3))) if m else (0, 0)
    if want_kept:
        result("%s: lookup drafted and kept tokens (%d drafted, %d kept)" % (name, *got),
               got[0] > 0 and got[1] > 0)
    return got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    a = ap.parse_args()
    shoal = os.path.abspath(a.shoal)
    tmp = tempfile.mkdtemp(prefix="shoal-spec-")
    try:
        base = ["--model", H.MODEL, "--no-echo"]
        three_ways(shoal, tmp, "greedy", base + ["--prompt", "ROMEO:", "--greedy",
                                                 "--max-tokens", "160"], want_kept=True)
        three_ways(shoal, tmp, "greedy, drafts on the scalar kernels",
                   base + ["--prompt", "ROMEO:", "--greedy", "--max-tokens", "60"], isa="scalar")
        for dm in ("1", "4", "16"):
            three_ways(shoal, tmp, "sampled, --draft-max %s" % dm,
                       base + ["--prompt", "JULIET:", "--temp", "0.7", "--seed", "3",
                               "--top-k", "30", "--top-p", "0.9", "--repeat-penalty", "1.1",
                               "--presence-penalty", "0.3", "--frequency-penalty", "0.2",
                               "--max-tokens", "120", "--draft-max", dm])
        three_ways(shoal, tmp, "--stop", base + ["--prompt", "ROMEO:", "--greedy",
                                                 "--max-tokens", "160", "--stop", "thee how"])
        three_ways(shoal, tmp, "context full", base + ["--prompt", "ROMEO:", "--greedy",
                                                       "--max-tokens", "100", "--ctx", "40"])
        for n in ("1", "2", "3"):
            three_ways(shoal, tmp, "--max-tokens %s" % n,
                       base + ["--prompt", "ROMEO: I'll tell thee how", "--greedy",
                               "--max-tokens", n])
        three_ways(shoal, tmp, "chat",
                   ["--model", H.MODEL, "--greedy", "--max-tokens", "60", "-v"], stdin="Good morrow, cousin.\nWhat news?\n", cmd="chat", want_kept=True)

        ct = os.path.join(tmp, "int4a8")
        r = run([shoal, "convert", H.MODEL, ct, "--experts", "int4a8", "--dense", "int4a8"])
        if result("int4a8 container converted", r.returncode == 0, r.stderr.strip()[-300:]):
            three_ways(shoal, tmp, "int4a8 container",
                       ["--model", ct, "--no-echo", "--prompt", "ROMEO:", "--greedy",
                        "--max-tokens", "120"], want_kept=True)
            three_ways(shoal, tmp, "int4a8 container, drafts on the scalar kernels",
                       ["--model", ct, "--no-echo", "--prompt", "ROMEO:", "--greedy",
                        "--max-tokens", "60"], isa="scalar")
        gguf = os.path.join(tmp, "q8.gguf")
        r = run([sys.executable, os.path.join(H.TESTS, "make_gguf.py"), gguf, "--type", "Q8_0"])
        if result("Q8_0 GGUF written", r.returncode == 0, r.stderr.strip()[-300:]):
            three_ways(shoal, tmp, "Q8_0 GGUF",
                       ["--model", gguf, "--no-echo", "--prompt", "ROMEO:", "--greedy",
                        "--max-tokens", "120"], want_kept=True)

        for model, args, want in ((gguf, ["--speculate", "mtp"], "no usable MTP layer"),
                                  (H.MODEL, ["--speculate", "on"], "unknown mode 'on'"),
                                  (H.MODEL, ["--draft-max", "0"], "--draft-max"),
                                  (H.MODEL, ["--draft-max", "17"], "--draft-max")):
            r = run([shoal, "run", "--model", model, "--prompt", "a"] + args)
            lines = r.stderr.strip().splitlines()
            result("run %s: one line naming it, exit 2" % " ".join(args),
                   r.returncode == 2 and len(lines) == 1 and want in r.stderr, r.stderr.strip())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return result.summary()


if __name__ == "__main__":
    sys.exit(main())
