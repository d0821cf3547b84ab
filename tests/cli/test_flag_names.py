#!/usr/bin/python3
"""One name and one meaning per concept across commands (issue 32, item 6).

usage: /usr/bin/python3 tests/cli/test_flag_names.py --shoal build-test/coordinator/shoal

Cases (each failed on the code before):
  hints:      perplexity on a model without a tokenizer names no flag that
              perplexity refuses (it suggested --tokens); run's error names
              --tokens, which run takes
  positional: tokenize, detokenize and template take the model as a plain
              path, as run does ([--model] [MODEL]), with the same output as
              --model; a second path or a second --model is exit 2, one line
  shards:     shard's count is --shards N; 'shard --workers 3' (--workers is
              the worker address list of run/chat/serve/bench) is exit 2 with
              one line naming --shards
  control:    status takes the coordinator's address as --control ADDR:PORT,
              the name run/chat/serve listen on; --coordinator is exit 2 with
              one line naming --control
  max-tokens: run and chat generate up to the same default (256, said in both
              helps); serve's help calls its --max-tokens the per-request
              default; bench's --gen is named when --max-tokens is given
  bench:      bench with no model runs the bundled model, as run does, and
              bench DIR is the same model as --model DIR
Ends with "N passed, M failed"; exit status 1 if anything failed.
"""

import argparse
import json
import os
import re
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # tests/
import harness as H  # noqa: E402

MODEL = H.MODEL
TIMEOUT = 300
FLAG = re.compile(r"(?<![A-Za-z0-9-])--[a-z][a-z0-9-]*")

result = H.Results()


def run(cmd, timeout=TIMEOUT, **kw):
    return H.run(cmd, timeout=timeout, env_default={"OMP_WAIT_POLICY": "passive"}, **kw)


def show(r):
    return "rc=%s stderr=%r" % (r.returncode, r.stderr.strip()[-600:])


def one_line(r, code):
    return r.returncode == code and len(r.stderr.strip().splitlines()) == 1


def help_text(a, cmd):
    return run([a.shoal, cmd, "--help"]).stdout


def flags_accepted(a, cmd, text):
    """The --flags that text names which cmd's --help does not list."""
    h = help_text(a, cmd)
    return [f for f in FLAG.findall(text)
            if not re.search(r"(?<![A-Za-z0-9-])%s(?![A-Za-z0-9-])" % re.escape(f), h)]


# ------------------------------------------------------------------ hints

def hints(a, tmp):
    notok = os.path.join(tmp, "notok")
    os.makedirs(notok, exist_ok=True)
    for f in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(MODEL, f), notok)
    text = os.path.join(tmp, "text.txt")
    with open(text, "w") as f:
        f.write("ROMEO:\nBut soft, what light through yonder window breaks?\n" * 8)
    r = run([a.shoal, "perplexity", notok, "--file", text])
    foreign = flags_accepted(a, "perplexity", r.stderr)
    result("perplexity without a tokenizer: one line, exit 1, 'no tokenizer', naming no flag "
           "perplexity refuses", one_line(r, 1) and "no tokenizer" in r.stderr and not foreign,
           "foreign flags %s; %s" % (foreign, show(r)))
    r = run([a.shoal, "run", notok, "--prompt", "ROMEO:"])
    foreign = flags_accepted(a, "run", r.stderr)
    result("run without a tokenizer: one line, exit 1, names --tokens, which run takes",
           one_line(r, 1) and "--tokens" in r.stderr and not foreign,
           "foreign flags %s; %s" % (foreign, show(r)))
    r = run([a.shoal, "run", notok, "--tokens", "17,300,3", "--max-tokens", "2"])
    result("... and run --tokens on that model works", r.returncode == 0, show(r))


# ------------------------------------------------------------------ positional

def positional(a, tmp):
    for cmd, rest in (("tokenize", ["--text", "ROMEO: hi"]),
                      ("detokenize", ["--ids", "813,58,285,105"]),
                      ("template", ["--system", "Be brief.", "--user", "Hi",
                                    "--add-generation-prompt"])):
        flag = run([a.shoal, cmd, "--model", MODEL] + rest)
        pos = run([a.shoal, cmd, MODEL] + rest)
        result("%s MODEL = %s --model MODEL" % (cmd, cmd),
               flag.returncode == 0 and pos.returncode == 0 and pos.stdout == flag.stdout and
               pos.stdout.strip() != "", show(pos))
        r = run([a.shoal, cmd, MODEL, "--model", MODEL] + rest)
        result("%s MODEL --model MODEL: the model given twice, one line, exit 2" % cmd,
               one_line(r, 2) and "already" in r.stderr, show(r))
        r = run([a.shoal, cmd, "--help"])
        result("%s --help: [--model] [PATH|DIR] as run's" % cmd,
               re.search(r"usage: shoal %s \[--model\] \[(PATH|DIR)\]" % cmd, r.stdout),
               r.stdout[:200])
    r = run([a.shoal, "tokenize", MODEL, "ROMEO: hi"])
    result("tokenize MODEL TEXT: one line, exit 2, naming --text",
           one_line(r, 2) and "--text" in r.stderr and "ROMEO: hi" in r.stderr, show(r))


# ------------------------------------------------------------------ shards

def shards(a, tmp):
    ct = os.path.join(tmp, "ct")
    r = run([a.shoal, "convert", MODEL, ct])
    if not result("convert the bundled model", r.returncode == 0, show(r)):
        return
    out = os.path.join(tmp, "sh")
    r = run([a.shoal, "shard", ct, "--workers", "3", "--out", out])
    result("shard --workers 3: one line, exit 2, the count is --shards N, nothing written",
           one_line(r, 2) and "--shards N" in r.stderr and "address" in r.stderr and
           not os.path.exists(out), show(r))
    r = run([a.shoal, "shard", ct, "--shards", "3", "--replicas", "2", "--out", out])
    result("shard --shards 3 --replicas 2 writes worker-0..2",
           r.returncode == 0 and all(os.path.isdir(os.path.join(out, "worker-%d" % i))
                                     for i in range(3)), show(r))
    r = run([a.shoal, "shard", ct, "--out", os.path.join(tmp, "sh2")])
    result("shard without a count: one line, exit 2, naming --shards N",
           one_line(r, 2) and "--shards N" in r.stderr, show(r))
    h = help_text(a, "shard")
    result("shard --help: --shards N, no --workers",
           "--shards N" in h and "--workers" not in h, h[:300])


# ------------------------------------------------------------------ control

def control(a, tmp):
    addr = "127.0.0.1:%d" % H.free_port()   # nothing listens there
    r = run([a.shoal, "status", "--control", addr, "--timeout", "2"])
    result("status --control ADDR: the address run/chat/serve's --control listens on "
           "(no coordinator there: one line, exit 1, naming it)",
           one_line(r, 1) and "cannot reach a coordinator at %s" % addr in r.stderr and
           "--coordinator" not in r.stderr, show(r))
    r = run([a.shoal, "status", "--coordinator", addr])
    result("status --coordinator: one line, exit 2, naming --control",
           one_line(r, 2) and "--control" in r.stderr, show(r))
    h = help_text(a, "status")
    result("status --help: --control ADDR:PORT, no --coordinator",
           "--control ADDR:PORT" in h and "--coordinator" not in h, h[:300])
    for cmd in ("run", "chat", "serve", "bench"):
        result("%s --help: --control ADDR:PORT|off" % cmd,
               "--control ADDR:PORT|off" in help_text(a, cmd), cmd)


# ------------------------------------------------------------------ max-tokens

def evaluated(stderr):
    m = re.search(r"over (\d+) tokens evaluated", stderr)
    return int(m.group(1)) if m else -1


def max_tokens(a, tmp):
    helps = {cmd: help_text(a, cmd) for cmd in ("run", "chat", "serve")}
    for cmd in ("run", "chat"):
        result("%s --help: --max-tokens N ... (default 256)" % cmd,
               re.search(r"--max-tokens N +tokens to generate \(default 256\)", helps[cmd]),
               helps[cmd][:200])
    flat = " ".join(helps["serve"].split())
    result("serve --help: --max-tokens is the default of a request without max_tokens",
           "--max-tokens N tokens a request generates when it gives no max_tokens" in flat and
           "16 for /v1/completions" in flat and "(default 256)" not in flat, flat[:300])
    # the bundled model's context is 256: a reply without --max-tokens runs
    # to the end of the context in both, past the old chat default of 128
    gen = ["--ignore-eos", "--seed", "3", "--stats", "-v"]
    c = run([a.shoal, "chat"] + gen, input="Good morrow\n")
    p = re.search(r"turn prefilled (\d+) new tokens", c.stderr)
    n_chat = evaluated(c.stderr) - (int(p.group(1)) if p else 0)
    result("chat without --max-tokens generates past 128 tokens (the old default)",
           c.returncode == 0 and p and n_chat > 128, "%d generated; %s" % (n_chat, show(c)))
    r = run([a.shoal, "run", "--tokens", "813"] + gen)
    n_run = evaluated(r.stderr) - 1
    result("run without --max-tokens generates past 128 tokens too (one default, 256)",
           r.returncode == 0 and n_run > 128, "%d generated; %s" % (n_run, show(r)))
    r = run([a.shoal, "bench", "--max-tokens", "4"])
    result("bench --max-tokens: one line, exit 2, naming --gen N",
           one_line(r, 2) and "--gen N" in r.stderr, show(r))


# ------------------------------------------------------------------ bench

def bench(a, tmp):
    quick = ["--limits", "off", "--reps", "1", "--gen", "2", "--prompt-len", "4"]
    out = os.path.join(tmp, "b0.json")
    r = run([a.shoal, "bench"] + quick + ["--json", out])
    got = None
    if r.returncode == 0 and os.path.exists(out):
        with open(out) as f:
            got = json.load(f)["model"]["dir"]
    result("bench with no model: the bundled model, as run", r.returncode == 0 and got and
           os.path.realpath(got) == os.path.realpath(MODEL), "model %r; %s" % (got, show(r)))
    out = os.path.join(tmp, "b1.json")
    r = run([a.shoal, "bench", MODEL] + quick + ["--json", out])
    got = None
    if r.returncode == 0 and os.path.exists(out):
        with open(out) as f:
            got = json.load(f)["model"]["dir"]
    result("bench DIR: DIR is the model", r.returncode == 0 and got == MODEL,
           "model %r; %s" % (got, show(r)))
    usage = help_text(a, "bench").splitlines()[0]
    result("bench --help: [--model] [DIR], as run", "[--model] [DIR]" in usage, usage)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--only", help="run only these cases (comma-separated function names)")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    a.shoal = os.path.abspath(a.shoal)
    tmp = tempfile.mkdtemp(prefix="shoal-flag-names-")
    try:
        cases = (hints, positional, shards, control, max_tokens, bench)
        only = set(a.only.split(",")) if a.only else None
        for fn in cases:
            if only and fn.__name__ not in only:
                continue
            try:
                fn(a, tmp)
            except Exception as e:   # a broken case must not hide the others
                result(fn.__name__, False, "exception: %r" % e)
    finally:
        if a.keep:
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return result.summary()


if __name__ == "__main__":
    sys.exit(main())
