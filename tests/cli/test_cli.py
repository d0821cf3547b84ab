#!/usr/bin/python3
"""What a first-time user meets on the command line (issue 12), on real processes.

usage: /usr/bin/python3 tests/cli/test_cli.py --shoal build-test/coordinator/shoal
           [--worker build-test/worker/shoal-worker] [--timeout SECONDS]

Cases (each failed on the code before issue 12's CLI work):
  help:       `shoal --help` names --version; `shoal help run` is run's help; every
              option a command's parser accepts (its string literals in coordinator/,
              the shared session and generation flags included) is in its --help;
              bench shows --json as optional
  paths:      every command takes its model positionally and as --model (convert,
              shard and synth their output as --out too), with the same result
  prompt:     run --file F and --prompt - (stdin) give what --prompt TEXT gives
  bad input:  run --model x.gguf without an architecture says what runs, convert
              x.gguf what a model is, synth --check x.gguf that it takes
              containers (exit 2); --ctx above the
              model's maximum exits 2; --tokens 1,abc,3 names 'abc'; status without a
              coordinator names its address once; perplexity into a pipe writes no '\\r'
  worker:     the start line's compute figure, beside a CPU hog with OpenMP's default
              (spinning) wait policy, is not rounded to 0.0x of its unit
  chat:       a too-long --system is named with its token count and the context size
              (exit 2); a message that does not fit even alone is refused without
              dropping history and the session goes on (exit 0); /help and /foo stay
              local; piped messages show as '> message' before their replies (issue
              32); through a pty, text typed while a reply streams is not echoed into
              it and stays typeahead for the next prompt
Ends with "N passed, M failed"; exit status 1 if anything failed.
"""

import argparse
import functools
import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import termios
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "cluster"))
import clusterlib  # noqa: E402  (kill_all: stopped processes are continued, then killed)
import harness as H  # noqa: E402  (tests/, on the path through clusterlib)
MODEL = os.path.join(ROOT, "models", "shakespeare-moe")
N_CTX = 256   # the bundled model's max_position_embeddings
CRASH = ("Sanitizer", "Segmentation", "core dumped", "Aborted", "Traceback")

TIMEOUT = 300


result = H.Results()


# output captured, TIMEOUT s, OMP_WAIT_POLICY passive unless the caller's says
run = functools.partial(H.run, timeout=TIMEOUT, env_default={"OMP_WAIT_POLICY": "passive"})


def show(r):
    return "rc=%d out=%r err=%r" % (r.returncode, r.stdout[-400:], r.stderr[-600:])


def no_crash(r):
    return not any(m in r.stderr for m in CRASH)


# ------------------------------------------------------------------ help

LIT = re.compile(r'"(--[a-z0-9][a-z0-9-]*|-[a-zA-Z])"')


def source(name):
    """A coordinator source file by name, whichever of its folders holds it."""
    for sub in ("", "cli", "bench", "text", "engine", "cluster"):
        path = os.path.join(ROOT, "coordinator", sub, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                return f.read()
    raise FileNotFoundError("coordinator/*/%s" % name)


def literals(text):
    return set(LIT.findall(text))


def options_by_command():
    """The flags each command's parser compares argv against: the whole-string
    literals "--x" / "-x" of its source file, plus the shared session flags
    (session_flags.c) and generation flags (shoal_gen_parse_flag) where it calls those."""
    sess = source("session_flags.c")
    i = sess.index("int shoal_gen_parse_flag(")
    gen = literals(sess[i:sess.index("\n}\n", i)])
    session = literals(sess) - gen
    conv = source("cmd_convert.c")
    j = conv.index("int shoal_cmd_inspect(")
    tok = source("cmd_tokenize.c")
    k = tok.index("int shoal_cmd_detokenize(")
    return {
        "run": literals(source("cmd_run.c")) | session | gen,
        # chat refuses run's --no-bos/--logits-out/--ids-out/--draft-logits-out
        # (checked below)
        "chat": (literals(source("cmd_chat.c")) | session | gen) -
                {"--no-bos", "--logits-out", "--ids-out", "--draft-logits-out"},
        "perplexity": literals(source("cmd_perplexity.c")) | session,
        # names a command refuses with a hint to its own flag (one name, one
        # meaning: tests/cli/test_flag_names.py): bench --max-tokens (--gen),
        # shard --workers (--shards), status --coordinator (--control)
        "bench": (literals(source("cmd_bench.c")) | session) - {"--max-tokens"},
        "synth": literals(source("cmd_synth.c")) | literals(source("synth_check.c")) | session,
        "convert": literals(conv[:j]),
        "inspect": literals(conv[j:]),
        "shard": literals(source("cmd_shard.c")) - {"--workers"},
        "status": literals(source("cmd_status.c")) - {"--coordinator"},
        "tokenize": literals(tok[:k]),
        "detokenize": literals(tok[k:]),
    }


def test_help(shoal):
    r = run([shoal, "--help"])
    result("shoal --help names --version", r.returncode == 0 and "--version" in r.stdout, show(r))
    a, b = run([shoal, "help", "run"]), run([shoal, "run", "--help"])
    result("shoal help run prints run's help",
           a.returncode == 0 and a.stdout == b.stdout and "--max-tokens" in a.stdout,
           show(a))
    r = run([shoal, "help", "nosuch"])
    result("shoal help nosuch: unknown command, exit 2",
           r.returncode == 2 and "unknown command 'nosuch'" in r.stderr, show(r))
    for cmd, flags in sorted(options_by_command().items()):
        r = run([shoal, cmd, "--help"])
        text = r.stdout
        missing = [f for f in sorted(flags - {"--help", "-h"})
                   if not re.search(r"(?<![A-Za-z0-9-])%s(?![A-Za-z0-9-])" % re.escape(f), text)]
        result("shoal %s --help lists every option it parses" % cmd,
               r.returncode == 0 and not missing, "missing %s" % missing)
    r = run([shoal, "bench", "--help"])
    usage = r.stdout.splitlines()[0] if r.stdout else ""
    result("bench --help: --json is optional", "[--json OUT]" in usage, usage)
    for cmd in ("run", "chat", "perplexity"):
        r = run([shoal, cmd, "--help"])
        flat = " ".join(r.stdout.split())
        result("%s --help says what --model accepts" % cmd,
               "--model DIR, DIR the model: a Hugging Face checkpoint directory" in flat and
               "or a shoal container (made by 'shoal convert')" in flat, r.stdout[:600])
    for flag in ("--no-bos", "--logits-out", "--draft-logits-out"):
        args = [flag] if flag == "--no-bos" else [flag, "/tmp/x.npy"]
        r = run([shoal, "chat", "--model", MODEL] + args, input="")
        result("chat %s: refused as a run option, exit 2" % flag,
               r.returncode == 2 and flag in r.stderr and "shoal run" in r.stderr, show(r))


# ------------------------------------------------------------------ paths

def test_paths(shoal, tmp):
    base = ["--tokens", "17,300,3", "--max-tokens", "4", "--greedy"]
    want = run([shoal, "run", "--model", MODEL] + base)
    got = run([shoal, "run", MODEL] + base)
    result("run MODEL = run --model MODEL", want.returncode == 0 and got.returncode == 0 and
           got.stdout == want.stdout and got.stdout.strip() != "", show(got))
    r = run([shoal, "run", MODEL, "--model", MODEL] + base)
    result("run MODEL --model MODEL: given twice, exit 2",
           r.returncode == 2 and "already" in r.stderr, show(r))
    r = run([shoal, "perplexity", MODEL, "--file", "/nonexistent-file"])
    result("perplexity MODEL is taken as the model", r.returncode == 2 and
           "nonexistent-file" in r.stderr and "unknown" not in r.stderr, show(r))
    r = run([shoal, "chat", MODEL, "--greedy", "--max-tokens", "3"], input="Good morrow\n")
    result("chat MODEL", r.returncode == 0 and r.stdout.strip() != "", show(r))

    ct1, ct2 = os.path.join(tmp, "ct1"), os.path.join(tmp, "ct2")
    r1 = run([shoal, "convert", MODEL, ct1])
    r2 = run([shoal, "convert", "--model", MODEL, "--out", ct2])
    same = (r1.returncode == 0 and r2.returncode == 0 and
            open(os.path.join(ct1, "experts.bin"), "rb").read() ==
            open(os.path.join(ct2, "experts.bin"), "rb").read())
    result("convert --model SRC --out DST = convert SRC DST", same, show(r2))
    r3 = run([shoal, "convert", "--out", os.path.join(tmp, "ct3"), MODEL])
    result("convert --out DST SRC", r3.returncode == 0, show(r3))
    a, b = run([shoal, "inspect", ct1]), run([shoal, "inspect", "--model", ct1])
    result("inspect --model DIR = inspect DIR", a.returncode == 0 and a.stdout == b.stdout, show(b))
    r = run([shoal, "shard", ct1, "--shards", "2", os.path.join(tmp, "sh1")])
    result("shard DIR --shards N OUT", r.returncode == 0 and
           os.path.isdir(os.path.join(tmp, "sh1", "worker-1")), show(r))
    # --trace zipf: no ../shared needed
    r = run([shoal, "synth", "--out", os.path.join(tmp, "syn"), "--gb", "0.002",
             "--trace", "zipf"])
    result("synth --out DST", r.returncode == 0 and
           os.path.exists(os.path.join(tmp, "syn", "shoal.json")), show(r))
    r = run([shoal, "synth", "--check", "--model", os.path.join(tmp, "syn"), "--decode", "2"])
    result("synth --check --model DIR", r.returncode == 0, show(r))
    return ct1


def test_prompt_sources(shoal, tmp):
    text = "KING HENRY:\nWhat news?"
    base = [shoal, "run", "--model", MODEL, "--max-tokens", "6", "--greedy", "--ids-out"]
    want = run(base + [os.path.join(tmp, "a.ids"), "--prompt", text])
    path = os.path.join(tmp, "prompt.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    got = run(base + [os.path.join(tmp, "b.ids"), "--file", path])
    ids = lambda n: open(os.path.join(tmp, n)).read()
    result("run --file F = run --prompt TEXT", want.returncode == 0 and got.returncode == 0 and
           got.stdout == want.stdout and ids("a.ids") == ids("b.ids"), show(got))
    got = run(base + [os.path.join(tmp, "c.ids"), "--prompt", "-"], input=text)
    result("run --prompt - reads stdin", got.returncode == 0 and got.stdout == want.stdout and
           ids("a.ids") == ids("c.ids"), show(got))
    got = run(base + [os.path.join(tmp, "d.ids"), "--file", "-"], input=text)
    result("run --file - reads stdin", got.returncode == 0 and got.stdout == want.stdout, show(got))
    r = run([shoal, "run", "--model", MODEL, "--prompt", "x", "--file", path])
    result("run --prompt and --file: exit 2", r.returncode == 2 and "exactly one" in r.stderr, show(r))


# ------------------------------------------------------------------ --isa

def test_isa(shoal, tmp):
    """--isa picks the kernels; every table gives the same logits bytes
    (DESIGN contract 1), also through the batched INT4A8 GEMM of a prefill
    (a 4-bit trunk, so attention and lm_head run it too) and the f16 KV."""
    ct = os.path.join(tmp, "isa-ct")
    r = run([shoal, "convert", MODEL, ct, "--experts", "int4a8", "--dense", "int4a8",
             "--group", "64", "--kv", "f16"])
    if r.returncode != 0:
        result("--isa: convert", False, show(r))
        return
    # the model: 4 layers x 4 KV heads x 32 x K and V x 2 bytes
    r = run([shoal, "inspect", ct])
    result("inspect: the trunk's dtypes and the file's KV dtype and bytes per token",
           r.returncode == 0 and "INT4A8" in r.stdout.split("dense bytes", 1)[-1].splitlines()[0]
           and "kv cache     f16, 2048 bytes per token" in r.stdout, show(r))
    ids = ",".join(str((i * 37 + 11) % 3000) for i in range(48))
    got = {}
    for isa in ["auto", "avx512", "avx512-zen4", "avx512bw", "avx2", "neon", "neon-dotprod", "neon-i8mm",
                "scalar"]:
        out = os.path.join(tmp, "isa-%s.npy" % isa)
        r = run([shoal, "run", ct, "--isa", isa, "--tokens", ids, "--max-tokens", "6",
                 "--greedy", "--logits-out", out])
        if r.returncode == 2 and "lacks them" in r.stderr:
            continue
        if r.returncode != 0:
            result("--isa %s runs" % isa, False, show(r))
            continue
        got[isa] = open(out, "rb").read()
    same = len(set(got.values())) == 1
    result("--isa: identical logits on %s" % ", ".join(sorted(got)), same and len(got) >= 3,
           "tables: %d, distinct outputs: %d" % (len(got), len(set(got.values()))))
    # the prefill chunk changes which kernels run (1: the matvec, 5: a GEMM
    # block of 4 and a matvec, 48: the GEMM), never the bits
    base = got.get("auto")
    for b in ["1", "5", "48"]:
        out = os.path.join(tmp, "batch-%s.npy" % b)
        r = run([shoal, "run", ct, "--batch", b, "--tokens", ids, "--max-tokens", "6",
                 "--greedy", "--logits-out", out])
        result("--batch %s: the logits of the default chunk" % b, r.returncode == 0 and
               base is not None and open(out, "rb").read() == base, show(r))
    # a bench result says which kernels and prefill chunk it measured
    jp = os.path.join(tmp, "bench-isa.json")
    r = run([shoal, "bench", ct, "--isa", "scalar", "--batch", "5", "--state", "warm",
             "--reps", "1", "--prompt-len", "8", "--gen", "2", "--limits", "off", "--json", jp])
    cfg = json.load(open(jp))["config"] if r.returncode == 0 and os.path.exists(jp) else {}
    result("bench --isa scalar --batch 5: recorded in the JSON's config",
           cfg.get("isa") == "scalar" and cfg.get("batch") == 5, show(r) + " config %s" % cfg)
    r = run([shoal, "run", ct, "--isa", "sse9", "--tokens", "1"])
    err = r.stderr.strip()
    result("--isa sse9: one line naming the choices, exit 2", r.returncode == 2 and
           len(err.splitlines()) == 1 and "avx2" in err and "sse9" in err, show(r))


# ------------------------------------------------------------------ bad input

def test_bad_scales(shoal, tmp):
    """A non-finite int8 / int4 group scale in a container's trunk is a
    one-line error naming the tensor, the row and the group when the model
    is loaded (contract 3), not NaN logits whose sign would differ between
    ISAs. (The routed experts' check, at the store's first read, is
    tests/unit/test_expert_store.c's: a poked expert needs its xxh64 and the
    manifest's fingerprint rewritten.) A tensor's scales are checked before
    its xxh64 (test_dense_checksum), so a poked scale gets this message."""
    import json
    import struct
    ct = os.path.join(tmp, "scales-ct")
    r = run([shoal, "convert", MODEL, ct, "--experts", "int4a8", "--dense", "int8",
             "--group", "32"])
    if r.returncode != 0:
        result("bad scales: convert", False, show(r))
        return
    with open(os.path.join(ct, "shoal.json")) as f:
        man = json.load(f)
    args = [shoal, "run", "--model", ct, "--tokens", "813,58,285", "--max-tokens", "2",
            "--greedy"]
    r = run(args)
    result("bad scales: the container runs before it is poked", r.returncode == 0, show(r))
    # blk.0.attn_q row 5, group 2 (INT8 [hidden][hidden], G=32)
    t = [x for x in man["dense"]["tensors"] if x["name"] == "blk.0.attn_q"][0]
    cols, group = t["shape"][1], t["group"]
    n_group = (cols + group - 1) // group
    row_bytes = (4 * n_group + cols + 3) // 4 * 4
    dense = os.path.join(ct, "dense.bin")
    at = t["offset"] + 5 * row_bytes + 4 * 2
    for value, name in ((float("nan"), "nan"), (float("-inf"), "-inf")):
        with open(dense, "r+b") as f:
            f.seek(at)
            old = f.read(4)
            f.seek(at)
            f.write(struct.pack("<f", value))
        r = run(args)
        err = r.stderr.strip()
        result("bad scales: %s in blk.0.attn_q's scales: one line naming it, exit 1" % name,
               r.returncode == 1 and len(err.splitlines()) == 1 and "'blk.0.attn_q'" in err and
               "group scale (row 5, group 2) is %s" % name in err and
               "expected a finite f32" in err and not r.stdout.strip(), show(r))
        with open(dense, "r+b") as f:
            f.seek(at)
            f.write(old)
    r = run(args)
    result("bad scales: restored, it runs again", r.returncode == 0, show(r))
    test_dense_checksum(shoal, ct, man, args)


def test_dense_checksum(shoal, ct, man, args):
    """A changed byte of a trunk tensor (not a scale: its codes) is a
    one-line checksum error naming the file and the tensor when the model
    is loaded, exit 1, nothing on stdout; it used to change the generated
    text and say nothing (only inspect --verify found it)."""
    t = [x for x in man["dense"]["tensors"] if x["name"] == "tok_embd"][0]
    dense = os.path.join(ct, "dense.bin")
    at = t["offset"] + t["bytes"] - 8   # the last row's last codes (its scales lead it)
    with open(dense, "r+b") as f:
        f.seek(at)
        old = f.read(4)
        f.seek(at)
        f.write(bytes(b ^ 0x5A for b in old))
    r = run(args)
    err = r.stderr.strip()
    result("dense checksum: a changed byte of '%s' is one line naming it, exit 1" % t["name"],
           r.returncode == 1 and len(err.splitlines()) == 1 and "checksum mismatch" in err and
           dense in err and "'%s'" % t["name"] in err and not r.stdout.strip(), show(r))
    with open(dense, "r+b") as f:
        f.seek(at)
        f.write(old)
    r = run(args)
    result("dense checksum: restored, it runs again", r.returncode == 0, show(r))


def test_endless_input(shoal):
    """An endless or huge input (/dev/zero as a file, as stdin) under an
    address-space limit smaller than the input limit is a one-line error,
    exit 1: the reader doubled its buffer past the limit and aborted on
    the allocation (SIGABRT). Over the limit it is the limit's message."""
    import resource

    def limit(n):
        return lambda: resource.setrlimit(resource.RLIMIT_AS, (n, n))
    for src, label in ((["--file", "/dev/zero"], "file"), (["--file", "-"], "stdin")):
        with open("/dev/zero", "rb") as zero:
            r = run([shoal, "perplexity"] + src, stdin=zero, preexec_fn=limit(1500 << 20))
        err = r.stderr.strip()
        result("perplexity on endless %s under a 1.5 GiB address-space limit: one line, exit 1"
               % label, r.returncode == 1 and len(err.splitlines()) == 1 and
               "out of memory reading" in err, show(r))
    r = run([shoal, "tokenize", "--file", "/dev/zero"], preexec_fn=limit(3 << 30))
    err = r.stderr.strip()
    result("tokenize on /dev/zero: the input limit's one line, exit 1",
           r.returncode == 1 and len(err.splitlines()) == 1 and "larger than the" in err and
           "-byte limit" in err, show(r))


def test_bad_prompts(shoal):
    """A prompt with no tokens, or a --tokens id outside the vocabulary, is
    a bad flag value: one line, exit 2 (both exited 1, while '--tokens 1,x'
    exited 2); --max-tokens past INT32_MAX is refused (the range said
    2147483648)."""
    r = run([shoal, "run", "--prompt", ""])
    err = r.stderr.strip()
    result("run --prompt '': one line, exit 2", r.returncode == 2 and
           len(err.splitlines()) == 1 and "empty" in err, show(r))
    r = run([shoal, "run", "--tokens", "5,99999", "--max-tokens", "1"])
    err = r.stderr.strip()
    result("run --tokens with an id past the vocabulary: one line naming it, exit 2",
           r.returncode == 2 and len(err.splitlines()) == 1 and "99999" in err and
           "position 1" in err and "--tokens" in err and not r.stdout.strip(), show(r))
    binary = os.path.join(tempfile.gettempdir(), "shoal-cli-binary-%d.dat" % os.getpid())
    with open(binary, "wb") as f:
        f.write(b"ROMEO: \xff\xfe not text \x00 at all" * 8)
    r = run([shoal, "perplexity", "--file", binary])
    os.unlink(binary)
    err = r.stderr.strip()
    result("perplexity on binary data: one line, not UTF-8 at byte 7, exit 1",
           r.returncode == 1 and len(err.splitlines()) == 1 and "not UTF-8 text" in err and
           "byte 7" in err and not r.stdout.strip(), show(r))
    r = run([shoal, "tokenize", "hello"])
    err = r.stderr.strip()
    result("tokenize hello: says 'hello' was read as the model path, exit 2",
           r.returncode == 2 and len(err.splitlines()) == 1 and "--text" in err and
           "'hello' was read as the model path" in err, show(r))
    r = run([shoal, "tokenize", "--text", "a", "--text", "b"])
    result("tokenize --text twice: refused, exit 2 (the last one won)",
           r.returncode == 2 and "--text given twice" in r.stderr, show(r))
    r = run([shoal, "run", "--prompt", "hi", "--max-tokens", "2147483648"])
    err = r.stderr.strip()
    result("run --max-tokens 2147483648: refused, the range ends at 2147483647",
           r.returncode == 2 and "2147483647]" in err, show(r))


def test_more_flag_values(shoal, worker, ct, tmp):
    """Bad flag values found by a fresh user: each one line, exit 2, before
    anything runs (they exited 1, printed another line first, retried
    forever, or blamed another coordinator)."""
    mirror = os.path.join(tmp, "mirror-ct")
    if not os.path.exists(mirror):
        shutil.copytree(ct, mirror)
    cases = [
        ("run --accept-workers and --control on one address",
         [shoal, "run", "--model", ct, "--prompt", "hi", "--accept-workers", "127.0.0.1:17552",
          "--control", "127.0.0.1:17552"], "are the same address"),
        ("run --mirror-weights with a weight too many",
         [shoal, "run", "--model", ct, "--prompt", "hi", "--mirror", mirror,
          "--mirror-weights", "1,2,3"], "--mirror-weights gives 3 weights for 2 sources"),
        ("bench --prompts FILE that does not exist",
         [shoal, "bench", "--model", ct, "--prompts", os.path.join(tmp, "none.txt")],
         "does not exist"),
        ("bench --limits FILE that does not exist",
         [shoal, "bench", "--model", ct, "--limits", os.path.join(tmp, "none.json")],
         "does not exist")]
    if os.path.exists(worker):
        cases.append(("shoal-worker --join ADDR:0", [worker, "--model", ct, "--join",
                                                     "127.0.0.1:0"], "port 0 cannot be dialled"))
    for label, cmd, want in cases:
        r = run(cmd, timeout=60)
        err = r.stderr.strip()
        result("%s: one line, exit 2" % label, r.returncode == 2 and
               len(err.splitlines()) == 1 and want in err, show(r))


def test_key_files(shoal, worker, tmp):
    """A key file given on the command line that will not load (missing,
    too short) is a bad flag value: one line naming the flag, exit 2,
    before any model opens. serve, run and the worker said 'cannot open'
    without the flag and exited 1 (serve only after loading the model)."""
    missing = os.path.join(tmp, "no-such.key")
    short = os.path.join(tmp, "short.key")
    with open(short, "w") as f:
        f.write("tooshort\n")
    os.chmod(short, 0o600)
    cases = [("serve --api-key", [shoal, "serve", "--api-key"], "serve: --api-key: "),
             ("run --cluster-key", [shoal, "run", "--prompt", "hi", "--workers",
                                    "127.0.0.1:1", "--cluster-key"], "--cluster-key: ")]
    if os.path.exists(worker):
        cases.append(("shoal-worker --cluster-key", [worker, "--model", MODEL,
                                                     "--cluster-key"], "--cluster-key: "))
    for label, cmd, prefix in cases:
        for path, why in ((missing, "cannot open"), (short, "bytes of secret")):
            r = run(cmd + [path])
            err = r.stderr.strip()
            result("%s %s: one line naming the flag, exit 2" % (label, os.path.basename(path)),
                   r.returncode == 2 and len(err.splitlines()) == 1 and prefix in err and
                   why in err and path in err, show(r))


def test_stdout_full(shoal, tmp):
    """Output that cannot be written (stdout on a full device) is an error,
    exit 1, for every command that prints its result there; run, chat,
    plan, inspect and perplexity exited 0."""
    if not os.path.exists("/dev/full"):
        result("stdout full: /dev/full exists", False, "no /dev/full")
        return
    text = os.path.join(tmp, "full.txt")
    with open(text, "w") as f:
        f.write("ROMEO: hello there my friend how are you\n")
    cmds = [["run", "--prompt", "ROMEO:", "--max-tokens", "3"],
            ["chat", "--max-tokens", "3"],
            ["plan", os.path.join(MODEL, "config.json")],
            ["perplexity", "--file", text, "--ctx", "8"],
            ["tokenize", "--text", "ROMEO:"]]
    for cmd in cmds:
        with open("/dev/full", "w") as full:
            r = subprocess.run([shoal] + cmd, stdout=full, stderr=subprocess.PIPE, text=True,
                               input="hi\nthere\n" if cmd[0] == "chat" else None,
                               timeout=TIMEOUT, env=dict(os.environ, OMP_WAIT_POLICY="passive"))
        err = r.stderr.strip().splitlines()
        result("stdout full: %s exits 1 saying it cannot write, once" % cmd[0],
               r.returncode == 1 and err and "cannot write" in err[-1] and
               sum("cannot write" in e for e in err) == 1 and no_crash(r),
               "rc=%d err=%r" % (r.returncode, r.stderr[-300:]))


def test_nan_weights(shoal, tmp):
    """NaN weights in a checkpoint (bf16 0x7fff written over part of
    layers.0's q_proj) give NaN logits: run and perplexity stop with one
    line saying so and exit 1, where they printed NUL bytes and
    'perplexity nan' with exit 0."""
    import json
    import struct
    bad = os.path.join(tmp, "nan-model")
    shutil.copytree(MODEL, bad)
    path = os.path.join(bad, "model.safetensors")
    with open(path, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        t = json.loads(f.read(n))["model.layers.0.self_attn.q_proj.weight"]
        if t["dtype"] != "BF16":
            result("NaN weights: q_proj is bf16", False, t["dtype"])
            return
        f.seek(8 + n + t["data_offsets"][0])
        f.write(b"\xff\x7f" * 128)
    r = run([shoal, "run", "--model", bad, "--prompt", "hi", "--max-tokens", "3", "--no-echo"])
    err = r.stderr.strip()
    result("NaN weights: run stops on NaN logits, exit 1",
           r.returncode == 1 and "logits for generated token 1 hold NaN" in err and
           "not finite" in err and not r.stdout.strip(), show(r))
    text = os.path.join(tmp, "nan.txt")
    with open(text, "w") as f:
        f.write("ROMEO: hello there my friend how are you\n")
    r = run([shoal, "perplexity", "--model", bad, "--file", text, "--ctx", "8"])
    result("NaN weights: perplexity stops on NaN logits, exit 1",
           r.returncode == 1 and "window 1, position 0" in r.stderr and
           "hold NaN" in r.stderr and not r.stdout.strip(), show(r))
    r = run([shoal, "perplexity", "--model", MODEL, "--file", text, "--ctx", "8"])
    result("NaN weights: the intact model's perplexity is finite",
           r.returncode == 0 and r.stdout.startswith("perplexity ") and
           "nan" not in r.stdout, show(r))


def test_bad_input(shoal, tmp):
    gguf = os.path.join(tmp, "vocab.gguf")
    with open(gguf, "wb") as f:
        f.write(b"GGUF\x03\x00\x00\x00" + b"\x00" * 16)
    r = run([shoal, "run", "--model", gguf, "--prompt", "hi"])
    err = r.stderr.strip()
    result("run --model x.gguf without an architecture: says what runs, exit 2",
           r.returncode == 2 and len(err.splitlines()) == 1 and "does not exist" not in err and
           "general.architecture" in err and "qwen3moe" in err, show(r))
    r = run([shoal, "convert", gguf, os.path.join(tmp, "from-gguf")])
    err = r.stderr.strip()
    # convert takes a GGUF (tests/cli/test_gguf_convert.py): this one, as run says
    result("convert x.gguf without an architecture: says what runs, exit 2, no DST",
           r.returncode == 2 and len(err.splitlines()) == 1 and "does not exist" not in err and
           "general.architecture" in err and "qwen3moe" in err and
           not os.path.exists(os.path.join(tmp, "from-gguf")), show(r))
    r = run([shoal, "synth", "--check", gguf])
    err = r.stderr.strip()
    result("synth --check x.gguf: refused in one line naming GGUF, exit 2",
           r.returncode == 2 and len(err.splitlines()) == 1 and "GGUF" in err and
           "routing_counts" not in err + r.stdout, show(r))
    nothing = os.path.join(tmp, "nothing-here")
    for cmd in (["run", "--model", nothing, "--prompt", "hi"],
                ["tokenize", "--model", nothing, "--text", "hi"],
                ["detokenize", "--model", nothing, "--ids", "1"],
                ["inspect", nothing], ["convert", nothing, os.path.join(tmp, "out-ct")],
                ["plan", nothing]):
        r = run([shoal] + cmd)
        err = r.stderr.strip()
        result("%s with a missing model path: one line, exit 2" % cmd[0],
               r.returncode == 2 and len(err.splitlines()) == 1 and "does not exist" in err and
               nothing in err, show(r))
    r = run([shoal, "run", "--model", MODEL, "--ctx", "100000", "--tokens", "1"])
    result("--ctx above the model's maximum: exit 2",
           r.returncode == 2 and "100000" in r.stderr and str(N_CTX) in r.stderr, show(r))
    r = run([shoal, "run", "--model", MODEL, "--tokens", "1,abc,3"])
    result("--tokens 1,abc,3 names 'abc'",
           r.returncode == 2 and "'abc'" in r.stderr and "abc,3" not in r.stderr, show(r))
    missing = os.path.join(tmp, "no-such-file.txt")
    for cmd in (["run", "--model", MODEL, "--file", missing],
                ["perplexity", "--model", MODEL, "--file", missing],
                ["tokenize", "--model", MODEL, "--file", missing],
                ["run", "--model", MODEL, "--file", tmp]):
        r = run([shoal] + cmd)
        result("%s %s: one line, exit 2" % (cmd[0], "a directory as --file" if cmd[-1] == tmp
                                             else "--file (missing)"),
               r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and
               cmd[-1] in r.stderr, show(r))
    for extra, want in ((["--vars", "[1]"], "--vars must be a JSON object"),
                        (["--vars", "{bad"], "--vars must be a JSON object"),
                        (["--template", missing], "does not exist")):
        r = run([shoal, "template", "--model", MODEL, "--user", "hi"] + extra)
        result("template %s: one line naming the flag, exit 2" % " ".join(extra),
               r.returncode == 2 and want in r.stderr and
               len(r.stderr.strip().splitlines()) == 1, show(r))
    for ids in (",,", "1,2,", ",813"):
        r = run([shoal, "detokenize", "--model", MODEL, "--ids", ids])
        result("detokenize --ids %r: an empty item, exit 2" % ids,
               r.returncode == 2 and "empty item" in r.stderr and r.stdout == "", show(r))
    r = run([shoal, "detokenize", "--model", MODEL, "--ids", "[813, 58,285 105]"])
    result("detokenize --ids '[813, 58,285 105]' (a JSON list, spaces) still reads",
           r.returncode == 0 and r.stdout == "ROMEO: hi\n", show(r))
    addr = "127.0.0.1:1"
    r = run([shoal, "status", "--control", addr, "--timeout", "2"])
    result("status without a coordinator names the address once",
           r.returncode == 1 and r.stderr.count(addr) == 1 and "cannot reach" in r.stderr, show(r))
    text = os.path.join(tmp, "play.txt")
    with open(text, "w", encoding="utf-8") as f:
        f.write("ROMEO:\nBut soft, what light through yonder window breaks?\n" * 40)
    # bytes: text mode would turn '\r' into '\n'
    r = subprocess.run([shoal, "perplexity", "--model", MODEL, "--file", text, "--ctx", "32",
                        "--max-windows", "3"], capture_output=True, timeout=TIMEOUT,
                       env=dict(os.environ, OMP_WAIT_POLICY="passive"))
    result("perplexity into a pipe: no '\\r' progress",
           r.returncode == 0 and b"\r" not in r.stderr and b"perplexity" in r.stdout,
           "rc=%d err=%r" % (r.returncode, r.stderr[-300:]))


# ------------------------------------------------------------------ worker

def stop(p):
    """SIGTERM a worker and wait for it (kill after 60 s)."""
    p.send_signal(signal.SIGTERM)
    try:
        p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()


def test_worker_compute(worker, ct, tmp):
    """The start line's compute figure beside CPU hogs, OpenMP's default wait
    policy: the old probe timed 20 ms of team calls whose spinning members
    were descheduled and printed 0.00/0.01 GB/s."""
    n = os.cpu_count() or 2
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * n)]
    figures = []
    try:
        time.sleep(0.5)
        for _ in range(2):
            env = dict(os.environ)
            env.pop("OMP_WAIT_POLICY", None)
            p = subprocess.Popen([worker, "--model", ct, "--listen", "127.0.0.1:0"],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 env=env)
            line, t0 = "", time.time()
            while time.time() - t0 < TIMEOUT:
                line = p.stdout.readline()
                if not line or "serving" in line:
                    break
            stop(p)
            m = re.search(r"compute ([0-9.]+) (GB|MB)/s", line)
            figures.append((m.group(1), m.group(2)) if m else line.strip())
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    ok = all(isinstance(f, tuple) and float(f[0]) >= 1.0 for f in figures)
    result("worker start line: compute figure not rounded to 0.0x beside a CPU hog", ok,
           "figures %s" % figures)


def test_worker_wide_prefill(shoal, worker, tmp):
    """A prefill chunk's request to a worker carries chunk x top-k hidden
    rows; at hidden 8192, top-8, the default 256-token chunk would make a
    64 MiB request, over the wire's frame limit (requests are not split).
    The coordinator keeps a chunk under half a frame: a 300-token prompt
    served by the worker gives the logits of the in-process run."""
    ct = os.path.join(tmp, "wide")
    r = run([shoal, "synth", ct, "--gb", "0.05", "--hidden", "8192", "--moe-ff", "64",
             "--n-expert", "8", "--top-k", "8", "--layers", "1", "--vocab", "512", "--heads",
             "4", "--kv-heads", "1", "--head-dim", "64", "--trace", "uniform"])
    if r.returncode != 0:
        result("wide prefill: synth", False, show(r))
        return
    port = None
    p = subprocess.Popen([worker, "--model", ct, "--listen", "127.0.0.1:0"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        t0 = time.time()
        while time.time() - t0 < TIMEOUT and port is None:
            line = p.stdout.readline()
            if not line:
                break
            m = re.search(r"127\.0\.0\.1:(\d+)", line)
            if m and ("listen" in line or "serving" in line):
                port = m.group(1)
        ids = ",".join(str((i * 37) % 512) for i in range(300))
        base = [shoal, "run", ct, "--tokens", ids, "--max-tokens", "3", "--greedy"]
        a = run(base + ["--logits-out", os.path.join(tmp, "wide-local.npy")])
        b = run(base + ["--workers", "127.0.0.1:%s" % port, "--local-experts", "off",
                        "--request-timeout", "20", "--logits-out",
                        os.path.join(tmp, "wide-worker.npy")]) if port else None
        same = (a.returncode == 0 and b is not None and b.returncode == 0 and
                open(os.path.join(tmp, "wide-local.npy"), "rb").read() ==
                open(os.path.join(tmp, "wide-worker.npy"), "rb").read())
        result("a 300-token prefill at hidden 8192 through a worker: the local logits", same,
               show(b) if b is not None else "no worker port")
    finally:
        stop(p)


# ------------------------------------------------------------------ chat

def chat(shoal, lines, *extra):
    return run([shoal, "chat", "--model", MODEL, "--greedy", "--max-tokens", "4", "-v"] +
               list(extra), input="".join(l + "\n" for l in lines))


def turns(stderr):
    return [(int(a), int(b)) for a, b in
            re.findall(r"turn prefilled (\d+) new tokens \((\d+) reused", stderr)]


def test_chat(shoal):
    long_sys = "to be or not to be, that is the question " * 60
    r = chat(shoal, ["hello"], "--system", long_sys)
    m = re.search(r"system prompt is too long: (\d+) tokens.*context holds (\d+)", r.stderr)
    result("chat: a too-long --system is named with its tokens and the context, exit 2",
           r.returncode == 2 and m is not None and int(m.group(1)) > N_CTX and
           int(m.group(2)) == N_CTX and "message" not in r.stderr.split("system prompt")[0] and
           no_crash(r), show(r))

    big = "to be or not to be, " * 90   # > 256 tokens alone
    r = chat(shoal, ["Good morrow", big, "What news?"])
    t = turns(r.stderr)
    ok = (r.returncode == 0 and "does not fit" in r.stderr and "dropped" not in r.stderr and
          len(t) == 2 and t[1][1] > 0 and no_crash(r))
    result("chat piped: an over-long message is refused, nothing dropped, session goes on, exit 0",
           ok, "turns %s; %s" % (t, show(r)))
    m = re.search(r"needs (\d+) tokens.*?(\d+)-token context", r.stderr)
    result("chat: the refusal names the tokens needed and the context",
           m is not None and int(m.group(1)) >= N_CTX and int(m.group(2)) == N_CTX, r.stderr)

    mid_sys = "to be or not to be, " * 10
    mid = "to be or not to be, " * 22
    r = chat(shoal, ["Good morrow", "What news?", mid], "--system", mid_sys)
    t = turns(r.stderr)
    result("chat: a message that fits once old exchanges go still drops them and replies",
           r.returncode == 0 and "dropped the oldest exchange" in r.stderr and len(t) == 3,
           "turns %s; %s" % (t, show(r)))
    r = chat(shoal, ["Good morrow", mid + mid], "--system", mid_sys)
    m = re.search(r"needs (\d+) tokens \((\d+) of them the system prompt's\)", r.stderr)
    result("chat: a message too long beside the system prompt names both counts",
           r.returncode == 0 and m is not None and "dropped" not in r.stderr and
           0 < int(m.group(2)) < int(m.group(1)), show(r))

    r = chat(shoal, ["/help", "/foo", "/quit now", "//reset is a word", "/quit"])
    t = turns(r.stderr)
    result("chat: /help prints the commands locally",
           "/reset" in r.stdout and "/quit" in r.stdout and "/help" in r.stdout, show(r))
    result("chat: /foo is an unknown command, not a message",
           "unknown command '/foo'" in r.stderr and "/quit takes no arguments" in r.stderr and
           len(t) == 1 and r.returncode == 0, "turns %s; %s" % (t, show(r)))

    # piped input (issue 32 item 10): each message is printed as '> message'
    # before its reply, so the transcript says which message a reply answers
    r = chat(shoal, ["Good morrow, sir.", "What news?"], "--max-tokens", "8")
    m = re.fullmatch(r"> Good morrow, sir\.\n(.*?\S.*?)\n> What news\?\n(.*?\S.*?)\n", r.stdout,
                     re.S)
    result("chat piped: each message shows as '> message' before its (non-empty) reply",
           r.returncode == 0 and m is not None and len(turns(r.stderr)) == 2, show(r))

    # --print-prompt: each turn's prompt on stderr, the same bytes `shoal template` renders
    r = chat(shoal, ["Good morrow", "What news?"], "--system", "Be brief.", "--print-prompt")
    got = re.findall(r"--- prompt \((\d+) bytes\)\n(.*?)\n--- end of prompt\n", r.stderr, re.S)
    first = run([shoal, "template", "--model", MODEL, "--system", "Be brief.", "--user",
                 "Good morrow", "--add-generation-prompt"])
    result("chat --print-prompt: each turn's prompt, byte for byte as shoal template renders it",
           r.returncode == 0 and len(got) == 2 and got[0][1] == first.stdout and
           all(int(n) == len(p.encode()) for n, p in got) and
           got[1][1].startswith(first.stdout) and got[1][1].count("What news?") == 1,
           "prompts %r; template %r; %s" % (got, first.stdout, show(r)))

    # a template that renders nothing for a turn: refused, no crash (was SIGSEGV)
    tmp = tempfile.mkdtemp(prefix="shoal-cli-empty-")
    try:
        for f in ("config.json", "model.safetensors", "tokenizer.json"):
            os.symlink(os.path.join(MODEL, f), os.path.join(tmp, f))
        with open(os.path.join(MODEL, "tokenizer_config.json")) as f:
            tc = json.load(f)
        for tpl, lines, extra in (("", ["hello"], []),
                                  ("{% if messages|length == 1 %}{{ messages[0].content }}"
                                   "{% endif %}", ["hello there", "second"], []),
                                  ("{% if messages|length == 1 %}{{ messages[0].content }}"
                                   "{% endif %}", ["hello there"], ["--system", "be brief"])):
            tc["chat_template"] = tpl
            with open(os.path.join(tmp, "tokenizer_config.json"), "w") as f:
                json.dump(tc, f)
            r = run([shoal, "chat", "--model", tmp, "--greedy", "--max-tokens", "3", "-v"] + extra,
                    input="".join(l + "\n" for l in lines))
            t = turns(r.stderr)
            result("chat: a template that renders no tokens for a turn is refused (%d lines%s)"
                   % (len(lines), ", --system" if extra else ""),
                   r.returncode == 0 and "rendered no tokens" in r.stderr and no_crash(r) and
                   len(t) == len(lines) - 1 and all(a > 0 and b >= 0 for a, b in t),
                   "turns %s; %s" % (t, show(r)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_stats_labels(shoal, ct, tmp):
    """Issue 32 item 8: statistics say what they cover. chat's --stats at
    exit: the time per token and the store's stall over the same tokens
    (all the session evaluated, /reset or not; the time line used the KV
    cache's current length); perplexity --json names the model."""
    # a container, for the expert store's lines
    r = run([shoal, "chat", "--model", ct, "--greedy", "--max-tokens", "4", "--stats"],
            input="Good morrow, sir.\nWhat news?\n/reset\nSpeak again.\n")
    store = re.search(r"stalled [\d.]+ ms/token over (\d+) tokens", r.stderr)
    times = re.search(r"time per token over (\d+) tokens evaluated", r.stderr)
    result("chat --stats: time per token and the store's stall cover the same tokens "
           "(the whole session), labelled", r.returncode == 0 and store and times and
           store.group(1) == times.group(1) and int(times.group(1)) > 0, show(r))
    text = os.path.join(tmp, "ppl.txt")
    with open(text, "w") as f:
        f.write(open(os.path.join(MODEL, "MODEL_CARD.md")).read() * 2)
    r = run([shoal, "perplexity", MODEL, "--file", text, "--max-windows", "1", "--json"])
    try:
        j = json.loads(r.stdout)
    except ValueError:
        j = {}
    result("perplexity --json names the model and its type beside the file",
           r.returncode == 0 and j.get("model") == MODEL and j.get("model_type") == "qwen3_moe"
           and j.get("file") == text and j.get("n_windows") == 1, show(r))
    # llama-perplexity's protocol: only the second half of each window scored
    r2 = run([shoal, "perplexity", MODEL, "--file", text, "--max-windows", "2", "--ctx", "64",
              "--score-from", "32", "--json"])
    r3 = run([shoal, "perplexity", MODEL, "--file", text, "--max-windows", "2", "--ctx", "64",
              "--json"])
    try:
        j2, j3 = json.loads(r2.stdout), json.loads(r3.stdout)
    except ValueError:
        j2, j3 = {}, {}
    result("perplexity --score-from 32 --ctx 64: 2 x 31 predictions (not 2 x 63), another "
           "loss", r2.returncode == 0 and j2.get("n_predictions") == 62 and
           j2.get("score_from") == 32 and j3.get("n_predictions") == 126 and
           j2.get("loss") != j3.get("loss"), show(r2))
    r = run([shoal, "perplexity", MODEL, "--file", text, "--ctx", "64", "--score-from", "63"])
    result("perplexity --score-from 63 --ctx 64: nothing to score, exit 2, naming 0..62",
           r.returncode == 2 and "0..62" in r.stderr, show(r))


def test_chat_typeahead(shoal):
    """Through a pty: stop the process while a long reply streams, type, go
    on. The typed text must not show inside the reply, and it is kept: typed
    '/qu' plus 'it' after the prompt quits the session."""
    for attempt in range(3):
        master, slave = pty.openpty()
        env = dict(os.environ, OMP_WAIT_POLICY="passive", TERM="dumb")
        p = subprocess.Popen([shoal, "chat", "--model", MODEL, "--greedy", "--ignore-eos",
                              "--max-tokens", "200", "--threads", "1"],
                             stdin=slave, stdout=slave, stderr=slave, env=env,
                             start_new_session=True)
        clusterlib.procs.append(p)
        os.close(slave)
        out = b""

        def read_for(sec, until=None):
            nonlocal out
            t0 = time.time()
            while time.time() - t0 < sec:
                r, _, _ = select.select([master], [], [], 0.05)
                if r:
                    try:
                        chunk = os.read(master, 65536)
                    except OSError:
                        return False
                    if not chunk:
                        return False
                    out += chunk
                    if until and until(out):
                        return True
            return False

        stopped_mid = False
        try:
            read_for(60, lambda o: b"> " in o)
            os.write(master, b"Good morrow\r")
            start = len(out)
            # the reply starts after the echoed line
            if read_for(60, lambda o: len(o) > start + len("Good morrow\r\n") + 3):
                os.kill(p.pid, signal.SIGSTOP)
                time.sleep(0.2)
                read_for(0.3)
                seen = len(out)
                os.write(master, b"/quZZ\x7f\x7f")   # typed (and corrected) mid-reply
                time.sleep(0.3)
                read_for(0.3)
                os.kill(p.pid, signal.SIGCONT)
                stopped_mid = not out[start:].rstrip().endswith(b">") and b"\n> " not in out[start:]
                read_for(60, lambda o: b"\n> " in o[start:])
                reply = out[start:out.index(b"\n> ", start)] if b"\n> " in out[start:] else out[start:]
                os.write(master, b"it\r")
                try:
                    rc = p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    rc = None
                read_for(0.5)
                if not stopped_mid and attempt < 2:
                    continue   # the reply had ended before the stop: try again
                result("chat tty: text typed while a reply streams is not echoed into it",
                       stopped_mid and b"/qu" not in reply and b"ZZ" not in reply,
                       "reply %r (stopped mid-reply: %s, %d bytes before the stop)" %
                       (reply[-200:], stopped_mid, seen - start))
                result("chat tty: the typed text stays typeahead ('/qu' + 'it' quits)",
                       rc == 0, "rc=%s tail %r" % (rc, out[-300:]))
                return
            result("chat tty: a reply started", False, repr(out[-300:]))
            return
        finally:
            clusterlib.kill_all()   # SIGCONT first: it may be stopped
            os.close(master)


def main():
    global TIMEOUT
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--worker", default=None)
    ap.add_argument("--timeout", type=float, default=300)
    args = ap.parse_args()
    TIMEOUT = args.timeout
    shoal = os.path.abspath(args.shoal)
    worker = args.worker or os.path.join(os.path.dirname(os.path.dirname(shoal)), "worker",
                                         "shoal-worker")
    tmp = tempfile.mkdtemp(prefix="shoal-cli-")
    try:
        test_help(shoal)
        ct = test_paths(shoal, tmp)
        test_prompt_sources(shoal, tmp)
        test_isa(shoal, tmp)
        test_bad_input(shoal, tmp)
        test_bad_scales(shoal, tmp)
        test_nan_weights(shoal, tmp)
        test_stdout_full(shoal, tmp)
        test_endless_input(shoal)
        test_key_files(shoal, worker, tmp)
        test_more_flag_values(shoal, worker, ct, tmp)
        test_bad_prompts(shoal)
        test_chat(shoal)
        test_stats_labels(shoal, ct, tmp)
        test_chat_typeahead(shoal)
        if os.path.exists(worker) and os.path.isdir(ct):
            test_worker_compute(worker, ct, tmp)
            test_worker_wide_prefill(shoal, worker, tmp)
        else:
            result("worker start line", False, "no %s or no container" % worker)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return result.summary()


if __name__ == "__main__":
    sys.exit(main())
