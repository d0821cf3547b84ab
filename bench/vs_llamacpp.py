#!/usr/bin/python3
"""shoal and llama.cpp side by side on the same weights (issue 13;
docs/BENCHMARKS.md, "vs llama.cpp").

usage: vs_llamacpp.py --llama-cpp DIR [--shoal PATH] [--work DIR]
                      [--steps model,convert,warm,cold] [--alternations N]
                      [--threads N] [--layers N] [--shape H,NH,NKV,HD,FF,NE,TOPK]
                      [--experts T] [--dense T] [--group G] [--kv T]
                      [--gguf TYPE] [--wait-policy unset|passive|active]
                      [--out JSON] [more: --help]

DIR is a llama.cpp source tree with a CPU build in DIR/build/bin
(llama-bench, llama-completion, llama-quantize); gguf-py is imported from
DIR/gguf-py. Nothing of llama.cpp is built here.

Steps (each skips what the work directory already holds):
  model    a byte-level BPE tokenizer trained on the project's texts and a
           random-weight qwen3_moe checkpoint as a Hugging Face directory
           (BF16 safetensors; bench/moe_checkpoint.py), WORK/hf-L<layers>
  convert  the same weights as GGUF (BF16, with DIR's gguf-py), then
           `llama-quantize Q4_0`; `shoal convert` with --experts/--dense/
           --group/--kv; a few tokens from each engine as a smoke test.
           With --gguf TYPE: the BF16 GGUF quantized by `llama-quantize` to
           TYPE instead, and no shoal container: both engines read that one
           file (shoal streams its experts from it, docs/MODELS.md)
  warm     engines alternating, files in the page cache: decode after a
           128-token prompt and prefill of 128 and 512-token prompts
           (shoal bench --state warm; llama-bench, Q4_0 repacked as usual);
           with --gguf, both on the TYPE file
  cold     engines alternating inside a memory cgroup at a half and a quarter
           of llama.cpp's file (Q4_0, or --gguf's), page cache dropped before
           every run, greedy and sampled (temperature 1, top-k 40): shoal run
           --expert-cache (limit - resident trunk - headroom) --direct on, the
           trunk being dense.bin or, with --gguf, the file's tensors other
           than the routed experts (memory-mapped); llama-completion with
           mmap and --no-repack (its repack copies weights into anonymous
           memory, which the limit kills). Bytes read per decode token from
           a second, shorter run of each engine.

--gguf TYPE is a llama-quantize type (Q4_K_M, Q8_0, Q6_K, ...), optionally
followed by llama-quantize options for a mix, in one argument:
--gguf 'Q4_K_M --tensor-type ffn_down_exps=q8_0'. The file is
WORK/L<layers>[-<shape>]-<type>[-<hash of the options>].gguf; quantizing
needs the BF16 GGUF (rewritten from the checkpoint when it was removed:
--keep-bf16-gguf keeps it for the next type).

Each engine runs at its own OpenMP default (--wait-policy unset, issue 31);
--wait-policy passive gives both OMP_WAIT_POLICY=passive (issue 13's
protocol, which handicaps llama.cpp: its threads meet at many barriers per
token) and active both spinning.

Prints each engine's min / median / max tok/s, the ratio of medians, bytes
read per token, peak RSS and the 1-minute load average, and the bits per
weight of both models (file bytes x 8 / parameters); warm, each engine's
decode against its RAM-read bound (--ram-probe: shoal's read probe just
before and after each decode run, the better one, over the bytes a decode
token reads at least); writes all of it, and
every run, as JSON (--out). Needs root for the cold step (drop_caches, cgroup).
Asserts nothing about speed; tests/bench/test_vs_llamacpp.py keeps it working.
"""
import argparse
import glob
import hashlib
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import benchlib  # noqa: E402
import moe_checkpoint as mc  # noqa: E402

ROOT = benchlib.ROOT
# shoal's dtypes, `shoal convert` flags. Q4_0 is 4.5 bits per weight (4-bit
# weights, an f16 scale per 32); shoal's int4 at group 64 with its f32 scale
# is 4.5 too (at group 32, 5). The KV cache in f16, as llama.cpp's default.
SHOAL_DTYPES = {"experts": "int4a8", "dense": "int4a8", "group": "64", "kv": "f16"}
SHOAL_WEIGHT_DTYPES = ("int4a8", "int4", "int8", "bf16", "f32")
LLAMA_BINARIES = ("llama-bench", "llama-completion", "llama-quantize")
STEPS = ("model", "convert", "warm", "cold")
LIMITS = {"half": 0.5, "quarter": 0.25}
MODES = ("greedy", "sampled")
# the cold runs' prompt (about 50 tokens of ordinary English)
PROMPT = ("The history of the river valley begins with the first farmers who settled along its banks, "
          "building small villages of mud and timber. Over the centuries, trade routes crossed the valley, "
          "bringing merchants, scholars and soldiers. Describe how the towns changed")
SAMPLING = ["--temp", "1.0", "--top-k", "40", "--top-p", "1.0", "--min-p", "0", "--seed", "7"]


class Usage(Exception):
    """A bad argument or a missing input: one line, exit 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise Usage(message)


def parse_args(argv):
    ap = Parser(prog="vs_llamacpp.py", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp", required=True, metavar="DIR",
                    help="llama.cpp source tree with a CPU build in DIR/build/bin")
    ap.add_argument("--llama-commit", help="the llama.cpp commit to record (default: what "
                    "llama-bench reports, else git in DIR)")
    ap.add_argument("--shoal", help="the shoal binary (default: build-test/ or build/coordinator/shoal)")
    ap.add_argument("--work", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "shoal-vs-llamacpp"),
                    help="work directory, outside the repository (12 layers: about 15 GB BF16 "
                    "+ 4.3 GB GGUF + 4-5 GB per shoal container)")
    ap.add_argument("--steps", default=",".join(STEPS), help="comma-separated, of %s" % ",".join(STEPS))
    ap.add_argument("--alternations", type=int, default=3, help="rounds of both engines (default 3)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads of each engine "
                    "(default: all cores)")
    ap.add_argument("--layers", type=int, default=12, help="layers of the model (default 12, the "
                    "issue's shape; fewer for a quick run)")
    ap.add_argument("--shape", metavar="H,NH,NKV,HD,FF,NE,TOPK", help="hidden size, heads, KV heads, "
                    "head dim, expert FFN size, experts, top-k (default: the issue's 2048,32,4,128,768,"
                    "128,8; e.g. 256,4,2,64,256,16,4 for a quick run, rows of 256 so K-quants apply)")
    ap.add_argument("--gguf", dest="gguf_type", metavar="TYPE", help="both engines read one GGUF, "
                    "the BF16 one quantized by llama-quantize to TYPE (Q4_K_M, Q8_0, Q6_K, ...; "
                    "llama-quantize options may follow in the same argument), instead of shoal "
                    "its own container and llama.cpp Q4_0 (default: off)")
    for k, v in SHOAL_DTYPES.items():
        ap.add_argument("--" + k, default=v, help="shoal convert --%s (default %s)" % (k, v or "its own"))
    ap.add_argument("--gen", type=int, default=64, help="decode tokens per warm run (default 64)")
    ap.add_argument("--prefill", default="128,512", help="warm prompt lengths (default 128,512; "
                    "decode is measured after the first: --prefill 4096 gives decode at 4 K "
                    "tokens of context, where the KV cache joins the bytes a token reads)")
    ap.add_argument("--cold-gen", type=int, default=64, help="tokens per cold run (default 64; a "
                    "16-token run of each engine gives the bytes per decode token)")
    ap.add_argument("--limits", default="half,quarter", help="cold memory limits, fractions of "
                    "llama.cpp's file (Q4_0 or --gguf's): half, quarter or a number (default "
                    "half,quarter)")
    ap.add_argument("--modes", default="greedy,sampled", help="cold decoding (default greedy,sampled)")
    ap.add_argument("--headroom", default="auto", help="cold: the limit less the resident trunk "
                    "(dense.bin, or the GGUF's tensors other than the experts) less this is shoal's "
                    "--expert-cache (default auto: shoal's KV cache at its default context, 4096 "
                    "tokens in f32, plus 64 MiB for the store's staging and spare expert buffers "
                    "and the process's own memory)")
    ap.add_argument("--load-limit", type=float, default=1.0, help="before each step wait for a "
                    "1-minute load below this (default 1.0) ...")
    ap.add_argument("--load-wait", type=int, default=0, help="... for at most this many seconds "
                    "(default 0: record the load, wait not)")
    ap.add_argument("--wait-policy", choices=("passive", "active", "unset"), default="unset",
                    help="OMP_WAIT_POLICY of both engines (default unset: each engine's own default, "
                    "where llama.cpp's OpenMP threads spin between its many per-token barriers "
                    "(issue 31); passive: issue 13's protocol, which handicaps llama.cpp)")
    ap.add_argument("--ram-probe", choices=("on", "off"), default="on", help="warm: shoal's RAM read "
                    "probe (shoal bench --limits-only, about 1 s) right before and after each engine's "
                    "decode run, the better one setting that run's RAM-read bound (default on: on a "
                    "shared host the read rate moves by 2x within minutes)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per engine run (default 1800)")
    ap.add_argument("--keep-bf16-gguf", action="store_true", help="keep the BF16 GGUF after "
                    "quantizing (default: removed, it is the size of the checkpoint)")
    ap.add_argument("--corpus", action="append", help="tokenizer training text (repeatable; "
                    "default: ../shared/data/corpus, docs/, Debian copyright files)")
    ap.add_argument("--out", help="JSON result (default WORK/results/vs_llamacpp.json)")
    a = ap.parse_args(argv)
    global WAIT_POLICY
    WAIT_POLICY = a.wait_policy
    a.steps = [s.strip() for s in a.steps.split(",") if s.strip()]
    for s in a.steps:
        if s not in STEPS:
            raise Usage("--steps: '%s' is not one of %s" % (s, ",".join(STEPS)))
    for name in ("alternations", "threads", "layers", "gen", "cold_gen"):
        if getattr(a, name) < 1:
            raise Usage("--%s: %d, expected >= 1" % (name.replace("_", "-"), getattr(a, name)))
    try:
        a.prefill = [int(x) for x in a.prefill.split(",")]
        a.limits = [(x, LIMITS[x] if x in LIMITS else float(x)) for x in a.limits.split(",")]
        a.headroom_bytes = None if a.headroom == "auto" else benchlib.parse_size(a.headroom)
    except (ValueError, KeyError) as e:
        raise Usage("--prefill/--limits/--headroom: %s" % e)
    if any(p < 1 for p in a.prefill):
        raise Usage("--prefill: %s, expected lengths >= 1" % a.prefill)
    if any(not 0 < f < 1 for _, f in a.limits):
        raise Usage("--limits: %s, expected fractions of llama.cpp's file in (0, 1)" % [f for _, f in a.limits])
    a.shape_obj = parse_shape(a.shape, a.layers)
    if a.headroom_bytes is None:
        a.headroom_bytes = auto_headroom(a.shape_obj)
    a.gguf_opts = parse_gguf_type(a.gguf_type) if a.gguf_type else None
    # shoal convert's choices, checked here: convert runs after the model step (an hour)
    for k, ok in (("experts", SHOAL_WEIGHT_DTYPES), ("dense", SHOAL_WEIGHT_DTYPES),
                  ("group", ("32", "64", "128")), ("kv", ("f32", "f16", "bf16"))):
        if getattr(a, k) and getattr(a, k) not in ok:
            raise Usage("--%s: '%s', expected one of %s" % (k, getattr(a, k), ",".join(ok)))
    a.modes = a.modes.split(",")
    if any(m not in MODES for m in a.modes):
        raise Usage("--modes: %s, expected some of %s" % (",".join(a.modes), ",".join(MODES)))
    a.cold_gen_short = min(16, a.cold_gen - 1) if a.cold_gen > 1 else None
    check_llama(a)
    if a.shoal is None:
        for d in ("build-test", "build"):
            a.shoal = os.path.join(ROOT, d, "coordinator", "shoal")
            if os.access(a.shoal, os.X_OK):
                break
    if not os.access(a.shoal, os.X_OK):
        raise Usage("--shoal %s: not an executable (build shoal, or pass --shoal)" % a.shoal)
    a.work = os.path.abspath(a.work)
    if (a.work + "/").startswith(ROOT + "/"):
        raise Usage("--work %s: inside the repository %s; the files are tens of GB" % (a.work, ROOT))
    a.out = a.out or os.path.join(a.work, "results", "vs_llamacpp.json")
    return a


# --headroom auto: what shoal holds besides the trunk and its expert cache. Its
# KV cache at the default context (4096 tokens, f32: the rows a long run
# fills), and 64 MiB: the store's staging (queue depth 8) and spare expert
# buffers, about 37 MB of Q4_K_M experts of 768 x 2048, and the rest of the
# process (measured: 33 MB of anonymous memory besides a 256 MiB cache, a
# 130-token run of the 6-layer file). It was a fixed 384M while the store's
# blobs came from malloc's heap, which grew to ~4x the cache (the store's
# blob_map, docs/BENCHMARKS_LOG.md).
SHOAL_CTX = 4096
HEADROOM_FIXED = 64 << 20


def auto_headroom(shape):
    kv = shape.layers * SHOAL_CTX * 2 * shape.kv_heads * shape.head_dim * 4
    return kv + HEADROOM_FIXED


def parse_shape(text, layers):
    """--shape H,NH,NKV,HD,FF,NE,TOPK (None: the issue's) -> mc.Shape (Usage if bad)."""
    if text is None:
        return mc.ISSUE_SHAPE(layers)
    try:
        v = [int(x) for x in text.split(",")]
    except ValueError:
        v = []
    if len(v) != 7 or min(v) < 1 or v[6] > v[5] or v[1] % v[2]:
        raise Usage("--shape: '%s', expected 7 positive integers H,NH,NKV,HD,FF,NE,TOPK with NKV "
                    "dividing NH and TOPK <= NE" % text)
    h, nh, nkv, hd, ff, ne, k = v
    return mc.Shape(layers=layers, hidden=h, heads=nh, kv_heads=nkv, head_dim=hd, experts=ne,
                    expert_ff=ff, top_k=k)


def parse_gguf_type(text):
    """--gguf 'TYPE [llama-quantize options]' -> (TYPE, [options]) (Usage if bad)."""
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise Usage("--gguf: '%s': %s" % (text, e))
    if not words or not re.fullmatch(r"[A-Za-z0-9_]+", words[0]) or \
            (len(words) > 1 and not words[1].startswith("-")):
        raise Usage("--gguf: '%s', expected a llama-quantize type (Q4_K_M, Q8_0, Q6_K, ...) and "
                    "then its options, e.g. 'Q4_K_M --tensor-type ffn_down_exps=q8_0'" % text)
    return words[0], words[1:]


def check_llama(a):
    """DIR/build/bin's binaries and DIR/gguf-py; sets a.bin and a.gguf (the module)."""
    d = a.llama_cpp = os.path.abspath(a.llama_cpp)
    missing = [os.path.join("build", "bin", b) for b in LLAMA_BINARIES
               if not os.access(os.path.join(d, "build", "bin", b), os.X_OK)]
    if not os.path.isfile(os.path.join(d, "gguf-py", "gguf", "__init__.py")):
        missing.append("gguf-py/gguf")
    if missing:
        raise Usage("--llama-cpp %s: missing %s (expected a llama.cpp source tree with a CPU build "
                    "in DIR/build/bin; this tool builds nothing of llama.cpp)" % (d, ", ".join(missing)))
    a.bin = {b: os.path.join(d, "build", "bin", b) for b in LLAMA_BINARIES}
    a.gguf = import_gguf(d)


def import_gguf(llama_dir):
    """llama.cpp's gguf-py package from llama_dir/gguf-py (Usage if it fails)."""
    sys.path.insert(0, os.path.join(llama_dir, "gguf-py"))
    try:
        import gguf
    except Exception as e:  # noqa: BLE001 - any import failure is the same answer
        raise Usage("--llama-cpp %s: gguf-py does not import (%s: %s)" % (llama_dir, type(e).__name__, e))
    return gguf


# ---- paths -------------------------------------------------------------------------


def paths(a):
    """Every file of the run, by role; llama_model and shoal_model are what
    each engine reads (with --gguf the same file, gguf)."""
    L = "L%d" % a.layers
    if a.shape:
        L += "-s" + a.shape.replace(",", "x")
    tag = "e%s-d%s-g%s%s" % (a.experts, a.dense, a.group, "-kv%s" % a.kv if a.kv else "")
    p = {"hf": os.path.join(a.work, "hf-" + L),
         "bf16": os.path.join(a.work, "%s-bf16.gguf" % L),
         "q4_0": os.path.join(a.work, "%s-q4_0.gguf" % L),
         "shoal": os.path.join(a.work, "%s-%s.shoal" % (L, tag)),
         "gguf": None,
         "logs": os.path.join(os.path.dirname(a.out), "logs")}
    if a.gguf_opts:
        typ, opts = a.gguf_opts
        h = "-" + hashlib.sha1(" ".join(opts).encode()).hexdigest()[:8] if opts else ""
        p["gguf"] = os.path.join(a.work, "%s-%s%s.gguf" % (L, typ.lower(), h))
    p["llama_model"] = p["gguf"] or p["q4_0"]
    p["shoal_model"] = p["gguf"] or p["shoal"]
    return p


def llama_label(a):
    """What llama.cpp reads, in words: Q4_0, or --gguf's type (and options)."""
    return a.gguf_type or "Q4_0"


def need_models(a):
    """Both engines' files, else Usage naming the step that makes them."""
    p = paths(a)
    need(p["llama_model"], "convert")
    if not p["gguf"]:
        need(os.path.join(p["shoal"], "shoal.json"), "convert")


def gguf_trunk_bytes(gguf, path):
    """Bytes of a GGUF's tensors other than the routed experts (*_exps): what a
    GGUF run keeps memory-mapped beside its expert cache."""
    return sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors if "_exps" not in t.name)


def need(path, step):
    if not os.path.exists(path):
        raise Usage("%s: missing; run --steps %s first" % (path, step))


# ---- running an engine ----------------------------------------------------------------


WAIT_POLICY = "unset"   # --wait-policy: OMP_WAIT_POLICY of both engines ("unset": their defaults)


def engine_env():
    """Both engines get the same OMP_WAIT_POLICY (--wait-policy: passive or
    active), or (unset, the default) neither has one: each its own default;
    and their own --threads."""
    e = dict(os.environ)
    if WAIT_POLICY == "unset":
        e.pop("OMP_WAIT_POLICY", None)
    else:
        e["OMP_WAIT_POLICY"] = WAIT_POLICY
    e.pop("OMP_NUM_THREADS", None)
    return e


# Runs one engine and reports its rusage. A child forked from this process would
# start with this process's peak RSS (Linux keeps the larger at exec; ours holds
# memory-mapped checkpoints), so a small interpreter forks the engine instead.
LAUNCHER = r"""
import json, os, sys
pid = os.fork()
if pid == 0:
    try:
        os.execv(sys.argv[2], sys.argv[2:])
    finally:
        os._exit(127)
_, status, ru = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    json.dump({"rc": os.waitstatus_to_exitcode(status), "inblock": ru.ru_inblock,
               "maxrss_kb": ru.ru_maxrss}, f)
"""
CLEANUP = None   # benchlib.Cleanup of main(): engines and cgroups go on SIGINT/SIGTERM too


def run(cmd, log, cgroup=None, timeout=1800):
    """Run cmd (list) with stdout and stderr to log.out / log.err, inside cgroup
    (a directory) if given; killed after timeout s (rc 124). Returns rc, wall_s,
    read_bytes (rusage inblock x 512), maxrss_mb (the engine and its waited
    children), the 1/5/15-minute load before and after, out and err."""
    la0 = benchlib.loadavg()
    pre = None
    if cgroup:
        def pre():
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
    ru_path = log + ".rusage.json"
    if os.path.exists(ru_path):
        os.unlink(ru_path)
    with open(log + ".out", "wb") as fo, open(log + ".err", "wb") as fe:
        t0 = time.time()
        p = subprocess.Popen([sys.executable, "-c", LAUNCHER, ru_path] + cmd, stdout=fo, stderr=fe,
                             env=engine_env(), preexec_fn=pre, start_new_session=True)

        def stop():
            try:
                os.killpg(p.pid, 9)   # the launcher's own group: it and the engine
            except ProcessLookupError:
                pass
            p.wait()
        if CLEANUP:
            CLEANUP.push("stop %s" % os.path.basename(cmd[0]), stop)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop()
        if CLEANUP:
            CLEANUP.actions.pop()
        wall = time.time() - t0
    try:
        ru = json.load(open(ru_path))
    except (OSError, ValueError):
        ru = {"rc": 124 if wall >= timeout else (p.returncode or 1), "inblock": 0, "maxrss_kb": 0}
    out = open(log + ".out", errors="replace").read()
    err = open(log + ".err", errors="replace").read()
    return {"cmd": " ".join(shlex.quote(c) for c in cmd), "rc": ru["rc"], "wall_s": round(wall, 2),
            "read_bytes": ru["inblock"] * 512, "maxrss_mb": round(ru["maxrss_kb"] / 1024, 1),
            "load_before": la0, "load_after": benchlib.loadavg(), "out": out, "err": err}


def parse_llama_completion(err):
    """llama-completion's timing lines -> prefill/decode tok/s, prompt tokens."""
    r = {}
    pe = re.findall(r"prompt eval time =\s*[\d.]+ ms /\s*(\d+) tokens.*?([\d.]+) tokens per second", err)
    ev = re.findall(r"\seval time =\s*[\d.]+ ms /\s*(\d+) runs.*?([\d.]+) tokens per second", err)
    if pe:
        r["prompt_tokens"], r["prefill_tok_s"] = int(pe[-1][0]), float(pe[-1][1])
    if ev:
        r["decode_tokens"], r["decode_tok_s"] = int(ev[-1][0]), float(ev[-1][1])
    return r


def parse_shoal_run(err):
    """shoal run's closing statistics line -> prefill/decode tok/s, prompt tokens."""
    m = re.search(r"shoal: prompt (\d+) tokens, prefill ([\d.]+) tok/s, TTFT [\d.]+ ms \| "
                  r"decode (\d+) tokens, ([\d.]+|n/a) tok/s", err)
    if not m:
        return {}
    r = {"prompt_tokens": int(m.group(1)), "prefill_tok_s": float(m.group(2)),
         "decode_tokens": int(m.group(3))}
    if m.group(4) != "n/a":
        r["decode_tok_s"] = float(m.group(4))
    return r


def parse_llama_bench(out):
    """llama-bench -o json -> {'pp128': tok/s, 'tg64@d128': tok/s, ...}, build_commit."""
    rows = json.loads(out[out.index("["):])
    r = {}
    for row in rows:
        key = ("pp%d" % row["n_prompt"]) if row["n_prompt"] else ("tg%d" % row["n_gen"])
        r[key + ("@d%d" % row["n_depth"] if row.get("n_depth") else "")] = row["avg_ts"]
        r["build_commit"] = row.get("build_commit")
    return r


def median_of(d, key):
    v = (d.get("summary") or {}).get(key) or {}
    return v.get("median")


def logname(a, name):
    os.makedirs(paths(a)["logs"], exist_ok=True)
    return os.path.join(paths(a)["logs"], name)


# ---- steps: model and convert ----------------------------------------------------------


def corpus_files(a):
    if a.corpus:
        return a.corpus
    files = sorted(glob.glob(os.path.join(os.path.dirname(ROOT), "shared", "data", "corpus", "*.txt")))
    files += sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "README.md")]
    return files + sorted(glob.glob("/usr/share/doc/*/copyright"))[:400]


def step_model(a, res):
    p = paths(a)
    hf = p["hf"]
    st = os.path.join(hf, "model.safetensors")
    cfgp = os.path.join(hf, "config.json")
    if os.path.exists(st) and json.load(open(cfgp)).get("num_hidden_layers") == a.layers:
        benchlib.log("model: %s is there" % hf)
    else:
        files = corpus_files(a)
        text = "".join(open(f, encoding="utf-8", errors="replace").read() for f in files)
        t0 = time.time()
        tok = mc.train_tokenizer(hf, mc.ISSUE_SHAPE().vocab, text)
        benchlib.log("model: tokenizer %s from %d files, %.1f MB, %.0f s" % (
            tok, len(files), len(text) / 1e6, time.time() - t0))
        res["tokenizer"] = dict(tok, files=len(files), chars=len(text))
        t0 = time.time()
        mc.write_hf_model(hf, a.shape_obj, 1234, tok["endoftext"], progress=benchlib.log)
        res["model_write_s"] = round(time.time() - t0)
    res["model"] = {"dir": hf, "shape": a.shape_obj.as_dict(),
                    "params": mc.param_counts(a.shape_obj),
                    "safetensors_bytes": os.path.getsize(st)}


def step_convert(a, res):
    p = paths(a)
    need(os.path.join(p["hf"], "model.safetensors"), "model")
    conv = res.setdefault("convert", {})
    if not os.path.exists(p["llama_model"]):
        if not os.path.exists(p["bf16"]):
            t0 = time.time()
            n = mc.write_gguf(p["hf"], p["bf16"], a.gguf, progress=benchlib.log)
            conv["gguf_bf16"] = {"tensors": n, "bytes": os.path.getsize(p["bf16"]), "s": round(time.time() - t0)}
        typ, opts = a.gguf_opts or ("Q4_0", [])
        r = run([a.bin["llama-quantize"]] + opts + [p["bf16"], p["llama_model"], typ, str(a.threads)],
                logname(a, "quantize"), timeout=7200)
        if r["rc"] != 0:
            raise RuntimeError("llama-quantize %s failed (%d): %s" % (llama_label(a), r["rc"],
                                                                      r["err"].strip()[-300:]))
        conv["quantize_s"] = r["wall_s"]
        conv["quantize_cmd"] = r["cmd"]
        if not a.keep_bf16_gguf:
            os.unlink(p["bf16"])
    if not p["gguf"] and not os.path.exists(os.path.join(p["shoal"], "shoal.json")):
        cmd = [a.shoal, "convert", p["hf"], p["shoal"], "--force"]
        for k in SHOAL_DTYPES:
            if getattr(a, k):
                cmd += ["--" + k, str(getattr(a, k))]
        r = run(cmd, logname(a, "shoal-convert"), timeout=7200)
        if r["rc"] != 0:
            raise RuntimeError("shoal convert failed (%d): %s" % (r["rc"], r["err"].strip()[-300:]))
        conv["shoal_convert_s"] = r["wall_s"]
    # smoke: each engine loads the model and generates (random weights: gibberish)
    r1 = run([a.bin["llama-completion"], "-m", p["llama_model"], "-p", PROMPT, "-n", "4", "--ignore-eos",
              "-t", str(a.threads), "--temp", "0", "-no-cnv", "--no-display-prompt"],
             logname(a, "smoke-llama"))
    r2 = run([a.shoal, "run", "--model", p["shoal_model"], "--prompt", PROMPT, "--max-tokens", "4",
              "--ignore-eos", "--greedy", "--threads", str(a.threads), "--no-echo"],
             logname(a, "smoke-shoal"))
    conv["smoke"] = {"llama": dict(parse_llama_completion(r1["err"]), rc=r1["rc"]),
                     "shoal": dict(parse_shoal_run(r2["err"]), rc=r2["rc"])}
    benchlib.log("convert: smoke %s" % json.dumps(conv["smoke"]))
    if r1["rc"] != 0 or r2["rc"] != 0:
        raise RuntimeError("smoke run failed: llama rc %d, shoal rc %d (logs in %s)%s" % (
            r1["rc"], r2["rc"], paths(a)["logs"], "; shoal: " + r2["err"].strip().splitlines()[-1]
            if r2["rc"] != 0 and r2["err"].strip() else ""))


def bits_per_weight(a, gguf):
    """File bytes x 8 / parameters of both models: all, experts, the rest."""
    p = paths(a)
    pc = mc.param_counts(a.shape_obj)
    out = {"params": pc}
    if os.path.exists(p["llama_model"]):
        rd = gguf.GGUFReader(p["llama_model"])
        ex = sum(int(t.n_bytes) for t in rd.tensors if "_exps" in t.name)
        rest = sum(int(t.n_bytes) for t in rd.tensors if "_exps" not in t.name)
        types = sorted({t.tensor_type.name for t in rd.tensors})
        ex_types = sorted({t.tensor_type.name for t in rd.tensors if "_exps" in t.name})
        size = os.path.getsize(p["llama_model"])
        out["llama"] = {"file": p["llama_model"], "bytes": size, "types": types,
                        "experts_types": ex_types, "bpw": 8 * size / pc["total"],
                        "bpw_experts": 8 * ex / pc["experts"], "bpw_rest": 8 * rest / pc["dense"]}
        if p["gguf"]:   # one file for both
            out["shoal"] = dict(out["llama"], experts_dtype="+".join(ex_types),
                                dense_dtype=",".join(types), same_file=True)
    if not p["gguf"] and os.path.exists(os.path.join(p["shoal"], "shoal.json")):
        ci = benchlib.container_info(p["shoal"])
        size = sum(os.path.getsize(f) for f in glob.glob(os.path.join(p["shoal"], "*")) if os.path.isfile(f))
        man = json.load(open(os.path.join(p["shoal"], "shoal.json")))
        dense = sorted({t["dtype"] for t in man["dense"]["tensors"] if len(t["shape"]) > 1})
        out["shoal"] = {"dir": p["shoal"], "bytes": size, "experts_dtype": ci["experts_dtype"],
                        "dense_dtype": ",".join(dense),
                        "bpw": 8 * size / pc["total"], "bpw_experts": 8 * ci["experts_file_bytes"] / pc["experts"],
                        "bpw_rest": 8 * ci["dense_bytes"] / pc["dense"]}
    return out


# ---- step: warm -----------------------------------------------------------------------


def warm_shoal(a, i, plen, gen):
    log = logname(a, "warm-%d-shoal-p%d" % (i, plen))
    cmd = [a.shoal, "bench", "--model", paths(a)["shoal_model"], "--state", "warm", "--threads", str(a.threads),
           "--prompt-len", str(plen), "--gen", str(gen), "--reps", "1", "--limits", "off",
           "--seed", "7", "--json", log + ".json"]
    if plen + gen > 4096:   # past shoal's default context (llama-bench sizes its own)
        cmd += ["--ctx", str(plen + gen)]
    r = run(cmd, log, timeout=a.timeout)
    figs = {}
    if r["rc"] == 0:
        d = json.load(open(log + ".json"))
        figs["pp%d" % plen] = median_of(d, "prefill_tok_s")
        if gen > 1:
            figs["tg%d@d%d" % (gen, plen)] = median_of(d, "decode_tok_s")
            for k in ("ms_per_token", "ms_attention", "ms_expert_compute", "ms_head", "expert_compute_mb_s",
                      "token_read_mb", "token_kv_read_mb"):
                figs["decode_" + k] = median_of(d, k)
        figs["shoal_commit"] = d.get("commit")
    return r, figs


def warm_llama(a, i, args, tag):
    log = logname(a, "warm-%d-llama-%s" % (i, tag))
    cmd = [a.bin["llama-bench"], "-m", paths(a)["llama_model"], "-t", str(a.threads), "-r", "1", "-o", "json"] + args
    r = run(cmd, log, timeout=a.timeout)
    return r, (parse_llama_bench(r["out"]) if r["rc"] == 0 else {})


def ram_probe(a, tag):
    """shoal's RAM read probe now (GB/s at the engines' thread count), or None"""
    if a.ram_probe != "on":
        return None
    log = logname(a, "probe-" + tag)
    r = run([a.shoal, "bench", "--limits-only", "--threads", str(a.threads), "--json", log + ".json"], log,
            timeout=120)
    if r["rc"] != 0:
        return None
    try:
        return json.load(open(log + ".json"))["limits"]["ram"]["read_gbs"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def probed(a, tag, fn):
    """fn() with a RAM probe right before and after it: (fn's result, [GB/s before, after])"""
    before = ram_probe(a, tag + "-before")
    out = fn()
    return out, [before, ram_probe(a, tag + "-after")]


def step_warm(a, res):
    need_models(a)
    res["load_wait"]["warm"] = wait_load(a)
    d0 = a.prefill[0]
    runs = res["warm"] = []
    for i in range(a.alternations):
        for eng in (("shoal", "llama") if i % 2 == 0 else ("llama", "shoal")):
            parts, probes = [], None
            if eng == "shoal":
                for plen in a.prefill:
                    if plen == d0:
                        part, probes = probed(a, "%d-shoal" % i, lambda: warm_shoal(a, i, plen, a.gen))
                        parts.append(part)
                    else:
                        parts.append(warm_shoal(a, i, plen, 1))
            else:
                parts.append(warm_llama(a, i, ["-p", ",".join(map(str, a.prefill)), "-n", "0"], "pp"))
                part, probes = probed(a, "%d-llama" % i, lambda: warm_llama(
                    a, i, ["-p", "0", "-n", str(a.gen), "-d", str(d0)], "tg"))
                parts.append(part)
            rec = {"alt": i, "engine": eng, "rc": max(abs(r["rc"]) for r, _ in parts),
                   "load_before": parts[0][0]["load_before"], "load_after": parts[-1][0]["load_after"],
                   "maxrss_mb": max(r["maxrss_mb"] for r, _ in parts),
                   "read_bytes": sum(r["read_bytes"] for r, _ in parts),
                   "wall_s": round(sum(r["wall_s"] for r, _ in parts), 1), "cmds": [r["cmd"] for r, _ in parts]}
            for _, f in parts:
                rec.update(f)
            rec["decode_tok_s"] = rec.get("tg%d@d%d" % (a.gen, d0))
            rec["ram_read_gbs"] = probes
            for plen in a.prefill:
                rec["prefill%d_tok_s" % plen] = rec.get("pp%d" % plen)
            if rec["rc"] != 0:
                rec["err_tail"] = [r["err"][-800:] for r, _ in parts if r["rc"] != 0]
            runs.append(rec)
            benchlib.log("warm %d %s: rc %d, decode %s, prefill %s tok/s, rss %.0f MB, load %.2f" % (
                i, eng, rec["rc"], benchlib.fmt(rec["decode_tok_s"], nd=2),
                "/".join(benchlib.fmt(rec["prefill%d_tok_s" % q], nd=1) for q in a.prefill),
                rec["maxrss_mb"], rec["load_before"][0]))


# ---- step: cold -----------------------------------------------------------------------


class Cgroup:
    """A child memory cgroup of this process's own (v1 memory controller, else v2),
    limited to limit bytes; removed by remove()."""

    def __init__(self, limit):
        v1 = [l.split(":", 2)[2].strip() for l in open("/proc/self/cgroup") if ":memory:" in l]
        if v1 and os.path.isdir("/sys/fs/cgroup/memory"):
            self.v1 = True
            self.path = "/sys/fs/cgroup/memory%s/shoal-vs-llamacpp" % v1[0].rstrip("/")
        else:
            own = [l.split(":", 2)[2].strip() for l in open("/proc/self/cgroup") if l.startswith("0::")]
            self.v1 = False
            self.path = "/sys/fs/cgroup%s/shoal-vs-llamacpp" % (own[0].rstrip("/") if own else "")
        os.makedirs(self.path, exist_ok=True)
        self._write("memory.limit_in_bytes" if self.v1 else "memory.max", str(limit))
        self.limit = limit

    def _write(self, f, v):
        with open(os.path.join(self.path, f), "w") as fh:
            fh.write(v)

    def reset(self):
        if self.v1:
            for f in ("memory.max_usage_in_bytes", "memory.failcnt"):
                try:
                    self._write(f, "0")
                except OSError:
                    pass

    def peak(self):
        f = "memory.max_usage_in_bytes" if self.v1 else "memory.peak"
        try:
            return int(open(os.path.join(self.path, f)).read())
        except (OSError, ValueError):
            return None

    def remove(self):
        for _ in range(40):
            try:
                os.rmdir(self.path)
                return True
            except OSError:
                time.sleep(0.25)
        return False


def cold_cmd(a, eng, n, mode, cache):
    p = paths(a)
    samp = SAMPLING if mode == "sampled" else None
    if eng == "shoal":
        return [a.shoal, "run", "--model", p["shoal_model"], "--expert-cache", cache, "--direct", "on",
                "--prompt", PROMPT, "--max-tokens", str(n), "--ignore-eos", *(samp or ["--greedy"]),
                "--threads", str(a.threads), "--stats", "--no-echo"]
    return [a.bin["llama-completion"], "-m", p["llama_model"], "-p", PROMPT, "-n", str(n), "--ignore-eos",
            "-t", str(a.threads), *(samp or ["--temp", "0"]), "-no-cnv", "--no-warmup", "-c", "4096",
            "--no-display-prompt", "--no-repack"]


def model_files(a):
    p = paths(a)
    if p["gguf"]:
        return [p["gguf"]]
    return [p["q4_0"]] + [os.path.join(p["shoal"], f) for f in ("experts.bin", "dense.bin")]


def evict(files):
    """The page cache drop, and each file's pages evicted (posix_fadvise) too."""
    benchlib.drop_caches()
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cached_mb(files):
    """MB of files in the page cache (util-linux fincore), None without it."""
    if not shutil.which("fincore"):
        return None
    r = benchlib.sh(["fincore", "--bytes", "--noheadings", "--output", "RES"] + files)
    try:
        return round(sum(int(x) for x in r.stdout.split()) / 2**20, 1)
    except ValueError:
        return None


def cold_one(a, cg, eng, n, mode, cache, tag):
    evict(model_files(a))
    cg.reset()
    cached = cached_mb(model_files(a))
    r = run(cold_cmd(a, eng, n, mode, cache), logname(a, "cold-%s-%s" % (tag, eng)),
            cgroup=cg.path, timeout=a.timeout)
    figs = parse_shoal_run(r["err"]) if eng == "shoal" else parse_llama_completion(r["err"])
    rec = {"engine": eng, "n_gen": n, "rc": r["rc"], "wall_s": r["wall_s"], "read_bytes": r["read_bytes"],
           "maxrss_mb": r["maxrss_mb"], "cgroup_peak_mb": (cg.peak() or 0) / 2**20,
           "load_before": r["load_before"], "load_after": r["load_after"], "cmd": r["cmd"],
           "cached_before_mb": cached, **figs}
    if r["rc"] != 0:
        rec["err_tail"] = r["err"][-800:]
    # An engine whose peak RSS passed the limit used pages charged outside the
    # cgroup (the file cached by something else meanwhile): not a cold run.
    if r["maxrss_mb"] > cg.limit / 2**20 * 1.02:
        rec["over_limit"] = True
        benchlib.log("cold %s %s: peak RSS %.0f MB over the %.0f MB limit (%s MB cached before); "
                     "left out" % (tag, eng, r["maxrss_mb"], cg.limit / 2**20, cached))
    benchlib.log("cold %s %s: rc %d, decode %s, prefill %s tok/s, read %.2f GB, rss %.0f MB, load %.2f" % (
        tag, eng, r["rc"], benchlib.fmt(rec.get("decode_tok_s"), nd=2), benchlib.fmt(rec.get("prefill_tok_s"), nd=1),
        r["read_bytes"] / 1e9, r["maxrss_mb"], r["load_before"][0]))
    return rec


def step_cold(a, res):
    p = paths(a)
    need_models(a)
    if os.geteuid() != 0:
        raise Usage("--steps cold: needs root (drop_caches, a memory cgroup)")
    size = os.path.getsize(p["llama_model"])
    dense = gguf_trunk_bytes(a.gguf, p["gguf"]) if p["gguf"] else \
        benchlib.container_info(p["shoal"])["dense_bytes"]
    res["load_wait"]["cold"] = wait_load(a)
    for lname, frac in a.limits:
        limit = int(size * frac)
        cache = max(64 << 20, limit - dense - a.headroom_bytes)
        cache_s = "%dM" % (cache >> 20)
        for mode in a.modes:
            key = "cold-%s-%s" % (lname, mode)
            sec = res.setdefault("cold", {})[key] = {"limit_bytes": limit, "fraction": frac,
                                                      "mode": mode, "expert_cache": cache_s,
                                                      "trunk_bytes": dense, "runs": []}
            cg = Cgroup(limit)
            if CLEANUP:
                CLEANUP.push("remove cgroup %s" % cg.path, cg.remove)
            try:
                for i in range(a.alternations):
                    for eng in (("shoal", "llama") if i % 2 == 0 else ("llama", "shoal")):
                        rec = cold_one(a, cg, eng, a.cold_gen, mode, cache_s, "%s-%d" % (key, i))
                        sec["runs"].append(dict(rec, alt=i))
                if a.cold_gen_short:
                    for eng in ("llama", "shoal"):
                        rec = cold_one(a, cg, eng, a.cold_gen_short, mode, cache_s, "%s-short" % key)
                        sec["runs"].append(dict(rec, alt="short"))
            finally:
                if CLEANUP:
                    CLEANUP.actions.pop()
                sec["cgroup"] = cg.path
                sec["cgroup_removed"] = cg.remove()


def wait_load(a):
    t0 = time.time()
    while True:
        la = benchlib.loadavg() or [0.0]
        if la[0] < a.load_limit or time.time() - t0 >= a.load_wait:
            return {"waited_s": round(time.time() - t0), "load": la, "settled": la[0] < a.load_limit}
        benchlib.log("load %.2f >= %.2f; waiting (%.0f of %d s)" % (la[0], a.load_limit, time.time() - t0,
                                                                  a.load_wait))
        time.sleep(30)


# ---- summary and report -----------------------------------------------------------------


def stats(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs), "n": len(xs)}


def row(figure, runs, field, bytes_per_token=None):
    """One line of the table: each engine's stats of field over runs (rc 0), the
    ratio of medians, the ratio per alternation, peak RSS and the load."""
    ok = [r for r in runs if r.get("rc") == 0 and not r.get("over_limit") and r.get("alt") != "short"]
    out = {"figure": figure, "field": field}
    for eng in ("shoal", "llama"):
        rs = [r for r in ok if r["engine"] == eng]
        out[eng] = stats([r.get(field) for r in rs])
        out[eng + "_maxrss_mb"] = max((r["maxrss_mb"] for r in rs), default=None)
        out[eng + "_failed"] = len([r for r in runs if r["engine"] == eng and r.get("rc") != 0])
        out[eng + "_over_limit"] = len([r for r in runs if r["engine"] == eng and r.get("over_limit")])
    ms, ml = (out["shoal"] or {}).get("median"), (out["llama"] or {}).get("median")
    out["ratio"] = benchlib.ratio(ms, ml)
    per = []
    for i in sorted({r["alt"] for r in ok if isinstance(r["alt"], int)}):
        x = {r["engine"]: r.get(field) for r in ok if r["alt"] == i}
        if x.get("shoal") and x.get("llama"):
            per.append(round(x["shoal"] / x["llama"], 3))
    out["ratios_per_alternation"] = per
    la = [r["load_before"][0] for r in runs] + [r["load_after"][0] for r in runs]
    out["load_1min"] = [min(la), max(la)] if la else None
    out["bytes_per_token"] = bytes_per_token
    return out


def decode_bytes_per_token(runs, eng):
    """Bytes read per decode token: (median of the long runs - the short run)
    over the difference in tokens (cancels loading and prefill); also the long
    runs' total read over tokens generated."""
    good = [r for r in runs if r["engine"] == eng and r.get("rc") == 0 and not r.get("over_limit")]
    lng = [r for r in good if r["alt"] != "short"]
    sh = [r for r in good if r["alt"] == "short"]
    if not lng:
        return None
    rb = statistics.median([r["read_bytes"] for r in lng])
    n = lng[0]["n_gen"]
    out = {"read_bytes_median": rb, "total_per_token": rb / n}
    if sh:
        out["decode_per_token"] = (rb - sh[0]["read_bytes"]) / (n - sh[0]["n_gen"])
    return out


def bound_ratios(a, res):
    """Each warm run's decode against its RAM-read bound: the better of the probes
    beside its decode run over the bytes a decode token reads at least (shoal
    bench's count: dense weights, the routed experts used, the KV rows; for
    llama.cpp the same count from the same alternation's shoal run, its weights
    scaled by the two files' bits per weight when they are not one file, its KV
    rows in f16 as llama.cpp keeps them). Sets decode_bound_ratio and
    bound_tok_s; 1 if any was set."""
    bpw = res.get("bits_per_weight") or {}
    same = (bpw.get("shoal") or {}).get("same_file")
    scale = 1.0
    if not same and (bpw.get("shoal") or {}).get("bpw") and (bpw.get("llama") or {}).get("bpw"):
        scale = bpw["llama"]["bpw"] / bpw["shoal"]["bpw"]
    shoal_mb = {r["alt"]: (r.get("decode_token_read_mb"), r.get("decode_token_kv_read_mb"))
                for r in res.get("warm") or [] if r["engine"] == "shoal" and r.get("decode_token_read_mb")}
    # shoal's KV element: a GGUF runs in f32 (shoal's default), a container in --kv
    shoal_kv_bytes = 4 if same or a.kv == "f32" else 2
    any_set = False
    for r in res.get("warm") or []:
        probes = [p for p in (r.get("ram_read_gbs") or []) if p]
        mb = shoal_mb.get(r["alt"]) or next(iter(shoal_mb.values()), None)
        if not probes or not mb or not r.get("decode_tok_s"):
            continue
        total, kv = mb[0], mb[1] or 0.0
        if r["engine"] == "llama":
            total = (total - kv) * scale + kv * 2 / shoal_kv_bytes
        r["bound_tok_s"] = max(probes) * 1e3 / total
        r["decode_bound_ratio"] = round(r["decode_tok_s"] / r["bound_tok_s"], 3)
        any_set = True
    return any_set


def summarize(a, res):
    rows = []
    if res.get("warm"):
        w = res["warm"]
        rows.append(row("warm decode after a %d-token prompt" % a.prefill[0], w, "decode_tok_s"))
        if bound_ratios(a, res):
            rows.append(row("warm decode / its RAM-read bound", w, "decode_bound_ratio"))
        for plen in a.prefill:
            rows.append(row("warm prefill, %d-token prompt" % plen, w, "prefill%d_tok_s" % plen))
    for key, sec in (res.get("cold") or {}).items():
        runs = sec["runs"]
        bpt = {eng: decode_bytes_per_token(runs, eng) for eng in ("shoal", "llama")}
        what = "cold, limit %.2f GiB (%s of %s), %s" % (
            sec["limit_bytes"] / 2**30, key.split("-")[1], llama_label(a), sec["mode"])
        rows.append(row("%s: decode" % what, runs, "decode_tok_s", bpt))
        rows.append(row("%s: prefill" % what, runs, "prefill_tok_s"))
        for r in rows[-2:]:
            r["section"] = key
    res["table"] = rows
    return rows


def fmt_stats(s, nd=2):
    if not s:
        return "n/a"
    return "%.*f / %.*f / %.*f" % (nd, s["min"], nd, s["median"], nd, s["max"])


def fmt_bytes(b):
    if not b:
        return "n/a"
    x = b.get("decode_per_token", b.get("total_per_token"))
    return "%.0f MB" % (x / 1e6) if x is not None else "n/a"


def print_report(a, res):
    bpw = res.get("bits_per_weight") or {}
    print("\n## shoal vs llama.cpp (%s)" % time.strftime("%Y-%m-%d %H:%M"))
    m = res.get("machine", {})
    isa = "AVX-512" if m.get("avx512f") else "AVX2" if m.get("avx2") else "no AVX2"
    print("machine: %s (%s), %s cores, %s GiB; threads %d each; OMP_WAIT_POLICY %s; alternations %d; "
          "load at start %s" % (m.get("cpu"), isa, m.get("cores"), m.get("ram_gib"), a.threads,
                                "unset (each engine's default)" if a.wait_policy == "unset" else a.wait_policy,
                                a.alternations, res.get("load_start")))
    print("shoal %s (%s); llama.cpp %s (%s)" % (res.get("shoal_commit"), a.shoal, res.get("llama_commit"),
                                                a.llama_cpp))
    if bpw.get("params"):
        pc = bpw["params"]
        print("model: qwen3_moe, %d layers%s, %.2f B parameters (experts %.2f B)" % (
            a.layers, " of shape %s" % a.shape if a.shape else "", pc["total"] / 1e9, pc["experts"] / 1e9))
    same = (bpw.get("shoal") or {}).get("same_file")
    if same:
        print("both engines read %s" % bpw["llama"]["file"])
    for eng, name in (("shoal", "shoal %s experts, %s dense" % (
            (bpw.get("shoal") or {}).get("experts_dtype"), (bpw.get("shoal") or {}).get("dense_dtype"))),
            ("llama", "llama.cpp %s (%s)" % (llama_label(a), ",".join((bpw.get("llama") or {}).get("types", []))))):
        b = bpw.get(eng)
        if same and eng == "shoal":
            continue
        if b:
            print("bits per weight, %s: %.2f all, %.2f experts, %.2f the rest (%.2f GB)" % (
                name, b["bpw"], b["bpw_experts"], b["bpw_rest"], b["bytes"] / 1e9))
    rows = res.get("table") or []
    if not rows:
        return
    print("\n| figure | shoal tok/s (min / median / max) | llama.cpp tok/s | shoal / llama.cpp "
          "(per alternation) | read per decode token, shoal / llama.cpp | peak RSS MB, shoal / llama.cpp "
          "| load 1-min |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        bpt = r.get("bytes_per_token")
        print("| %s | %s | %s | **%s** (%s) | %s | %s | %s |" % (
            r["figure"], fmt_stats(r["shoal"]), fmt_stats(r["llama"]), benchlib.fmt(r["ratio"], nd=2),
            ", ".join("%.2f" % x for x in r["ratios_per_alternation"]) or "-",
            "%s / %s" % (fmt_bytes(bpt.get("shoal")), fmt_bytes(bpt.get("llama"))) if bpt else "-",
            "%s / %s" % (benchlib.fmt(r["shoal_maxrss_mb"]), benchlib.fmt(r["llama_maxrss_mb"])),
            "%.2f-%.2f" % tuple(r["load_1min"]) if r["load_1min"] else "n/a"))
        for eng in ("shoal", "llama"):
            if r[eng + "_failed"]:
                print("  (%s: %d runs failed; see the JSON's err_tail)" % (eng, r[eng + "_failed"]))
            if r.get(eng + "_over_limit"):
                print("  (%s: %d runs left out: peak RSS over the limit)" % (eng, r[eng + "_over_limit"]))
    print_probes(res)


def print_probes(res):
    """the RAM read probes beside the warm decode runs, per engine"""
    for eng, name in (("shoal", "shoal"), ("llama", "llama.cpp")):
        ps = [p for r in res.get("warm") or [] if r["engine"] == eng for p in (r.get("ram_read_gbs") or []) if p]
        bs = [r["bound_tok_s"] for r in res.get("warm") or [] if r["engine"] == eng and r.get("bound_tok_s")]
        if ps and bs:
            print("RAM read probes beside %s's decode runs: %.1f-%.1f GB/s (bounds %.1f-%.1f tok/s)" % (
                name, min(ps), max(ps), min(bs), max(bs)))


def llama_commit(a, res):
    if a.llama_commit:
        return a.llama_commit
    for rec in res.get("warm") or []:
        c = rec.get("build_commit")
        if c and c != "unknown":
            return c
    r = benchlib.sh(["git", "-C", a.llama_cpp, "rev-parse", "HEAD"])
    return r.stdout.strip() if r.returncode == 0 else "unknown (pass --llama-commit)"


def main(argv=None):
    try:
        a = parse_args(sys.argv[1:] if argv is None else argv)
    except Usage as e:
        print("vs_llamacpp.py: %s" % e, file=sys.stderr)
        return 2
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    global CLEANUP
    CLEANUP = benchlib.Cleanup()
    res = {"schema": 1, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv[1:],
           "args": {k: v for k, v in vars(a).items() if k not in ("gguf", "bin", "shape_obj")},
           "machine": benchlib.machine_info(a.work), "load_wait": {}, "load_start": benchlib.loadavg()}
    r = benchlib.sh([a.shoal, "--version"])
    res["shoal_version"] = r.stdout.strip()
    res["shoal_commit"] = res["machine"].get("commit")
    rc = 0
    try:
        for s in a.steps:
            benchlib.log("== %s" % s)
            {"model": step_model, "convert": step_convert, "warm": step_warm, "cold": step_cold}[s](a, res)
    except Usage as e:
        print("vs_llamacpp.py: %s" % e, file=sys.stderr)
        rc = 2
    except (RuntimeError, OSError) as e:
        print("vs_llamacpp.py: %s" % e, file=sys.stderr)
        rc = 1
    finally:
        res["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
        res["load_end"] = benchlib.loadavg()
        res["llama_commit"] = llama_commit(a, res)
        res["bits_per_weight"] = bits_per_weight(a, a.gguf)
        summarize(a, res)
        with open(a.out + ".tmp", "w") as f:
            json.dump(res, f, indent=1)
        os.replace(a.out + ".tmp", a.out)
        print_report(a, res)
        print("\nwrote %s (logs in %s)" % (a.out, paths(a)["logs"]))
    return rc


if __name__ == "__main__":
    sys.exit(main())
