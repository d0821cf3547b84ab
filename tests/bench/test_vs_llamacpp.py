#!/usr/bin/python3
"""Smoke test of bench/vs_llamacpp.py and bench/moe_checkpoint.py (so the
benchmark does not rot); no llama.cpp needed for most of it.

  - bad arguments: no llama.cpp tree, a tree without binaries or gguf-py, a
    gguf-py that does not import, unknown --steps, --work inside the
    repository: exit 2, one line on stderr naming the problem, nothing run;
  - a tiny qwen3_moe checkpoint written by moe_checkpoint (tokenizer trained
    here, vocabulary padded past it) is read by `shoal convert` with the
    tool's default dtypes and generates (`shoal run --greedy`): ids in range;
  - the tokenizer: ids in range, fewer ids than bytes (merges apply), the text
    comes back from `shoal detokenize`, <|endoftext|> is the id training said;
  - the table's arithmetic (medians, ratios, bytes per decode token, runs
    over the memory limit left out, decode against the RAM-read bound) on
    made-up runs;
  - --wait-policy sets (or, unset, removes) both engines' OMP_WAIT_POLICY;
    unset is the default;
  - --gguf TYPE: the file's name (type, hash of the llama-quantize options),
    both engines' warm and cold commands on that one file, the cold step's
    eviction of it; --shape names its own checkpoint;
  - with SHOAL_LLAMA_CPP=<a llama.cpp source tree> (its gguf-py only): the GGUF
    written has 3 + 12 x layers tensors with the expected shapes, types and
    tokenizer; without it that case is skipped, saying so. With its CPU
    build too: llama.cpp runs it, and the tool's convert and warm steps with
    --gguf Q8_0 quantize it and run both engines on that file.
Asserts behaviour, never speed.

usage: test_vs_llamacpp.py --shoal BUILD/coordinator/shoal
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # tests/: harness
import harness as H  # noqa: E402
ROOT = os.path.dirname(os.path.dirname(HERE))
BENCH = os.path.join(ROOT, "bench", "vs_llamacpp.py")
sys.path.insert(0, os.path.join(ROOT, "bench"))
import moe_checkpoint as mc  # noqa: E402
import vs_llamacpp  # noqa: E402

result = H.Results()
check = result.check
TINY = mc.Shape(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, experts=8, expert_ff=32,
                top_k=2, vocab=320)
SHOAL = None   # --shoal, absolute
TEXT = "Once upon a time, the river valley was quiet. The farmers built small villages of mud."



def sh(cmd, timeout=300):
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    return subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout, env=env)


def fake_tree(root, binaries=True, gguf=None):
    """A directory shaped like a llama.cpp tree: stub binaries, and gguf-py with
    __init__.py text gguf (None: no gguf-py)."""
    if binaries:
        os.makedirs(os.path.join(root, "build", "bin"))
        for b in vs_llamacpp.LLAMA_BINARIES:
            p = os.path.join(root, "build", "bin", b)
            open(p, "w").write("#!/bin/sh\nexit 1\n")
            os.chmod(p, 0o755)
    if gguf is not None:
        os.makedirs(os.path.join(root, "gguf-py", "gguf"))
        open(os.path.join(root, "gguf-py", "gguf", "__init__.py"), "w").write(gguf)
    return root


def test_arguments(shoal, tmp):
    work = os.path.join(tmp, "work")
    nobin = fake_tree(os.path.join(tmp, "nobin"), binaries=False, gguf="")
    nogguf = fake_tree(os.path.join(tmp, "nogguf"))
    broken = fake_tree(os.path.join(tmp, "broken"), gguf="raise ImportError('no numpy here')\n")
    ok = fake_tree(os.path.join(tmp, "ok"), gguf="")
    cases = [
        ([], "--llama-cpp"),
        (["--llama-cpp", os.path.join(tmp, "none")], "missing build/bin/llama-bench"),
        (["--llama-cpp", nobin], "missing build/bin/llama-bench, build/bin/llama-completion, "
                                 "build/bin/llama-quantize"),
        (["--llama-cpp", nogguf], "missing gguf-py"),
        (["--llama-cpp", broken], "gguf-py does not import"),
        (["--llama-cpp", ok, "--steps", "model,bake"], "bake"),
        (["--llama-cpp", ok, "--alternations", "0"], "--alternations"),
        (["--llama-cpp", ok, "--limits", "half,2"], "--limits"),
        (["--llama-cpp", ok, "--dense", "int3"], "--dense"),
        (["--llama-cpp", ok, "--group", "48"], "--group"),
        (["--llama-cpp", ok, "--kv", "f8"], "--kv"),
        (["--llama-cpp", ok, "--wait-policy", "spin"], "--wait-policy"),
        (["--llama-cpp", ok, "--gguf", "Q4_K_M ffn_down_exps=q8_0"], "--gguf"),
        (["--llama-cpp", ok, "--gguf", "Q4-K"], "--gguf"),
        (["--llama-cpp", ok, "--shape", "256,4,3,64,256,16,4"], "--shape"),
        (["--llama-cpp", ok, "--shape", "256,4,2,64"], "--shape"),
        (["--llama-cpp", ok, "--gguf", "Q8_0", "--steps", "cold"], "run --steps convert first"),
        (["--llama-cpp", ok, "--work", os.path.join(ROOT, "pb")], "inside the repository"),
        (["--llama-cpp", ok, "--shoal", os.path.join(tmp, "noshoal")], "--shoal"),
        (["--llama-cpp", ok, "--steps", "warm"], "run --steps convert first"),
    ]
    for args, word in cases:
        full = [sys.executable, BENCH] + (["--shoal", shoal] if "--shoal" not in args else []) + \
            (["--work", work, "--out", os.path.join(work, "r.json")] if "--work" not in args else []) + args
        r = sh(full, timeout=120)
        lines = [l for l in r.stderr.splitlines() if l.strip()]
        if word == "run --steps convert first":   # a step's missing input: exit 2, report written
            lines = [l for l in lines if not l.startswith("==")]
            check(r.returncode == 2 and len(lines) == 1 and word in lines[0],
                  "%s: exit 2, one line '%s' (rc %d: %s)" % (" ".join(args[2:]), word, r.returncode, lines))
            continue
        check(r.returncode == 2 and len(lines) == 1 and word in lines[0] and not r.stdout,
              "%s: exit 2, one line naming '%s' (rc %d: %s)" % (" ".join(args) or "no arguments", word,
                                                               r.returncode, lines))
    check(not os.path.exists(os.path.join(ROOT, "pb")), "nothing written inside the repository")


def test_wait_policy():
    """--wait-policy reaches both engines' environment: passive / active set
    OMP_WAIT_POLICY, unset removes the caller's (each engine's own default)"""
    keep = (vs_llamacpp.WAIT_POLICY, os.environ.get("OMP_WAIT_POLICY"))
    try:
        os.environ["OMP_WAIT_POLICY"] = "caller"
        got = {}
        for pol in ("passive", "active", "unset"):
            vs_llamacpp.WAIT_POLICY = pol
            got[pol] = vs_llamacpp.engine_env().get("OMP_WAIT_POLICY")
        check(got == {"passive": "passive", "active": "active", "unset": None},
              "--wait-policy: OMP_WAIT_POLICY of the engines (%s)" % got)
    finally:
        vs_llamacpp.WAIT_POLICY = keep[0]
        if keep[1] is None:
            os.environ.pop("OMP_WAIT_POLICY", None)
        else:
            os.environ["OMP_WAIT_POLICY"] = keep[1]


def test_gguf_mode(shoal, tmp):
    """--gguf: one file for both engines, named by type and options; the
    default wait policy is each engine's own (unset)."""
    ok = os.path.join(tmp, "ok")
    work = os.path.join(tmp, "work-gguf")
    keep = vs_llamacpp.WAIT_POLICY
    try:
        base = ["--llama-cpp", ok, "--shoal", shoal, "--work", work, "--layers", "2"]
        a = vs_llamacpp.parse_args(base)
        check(a.wait_policy == "unset" and vs_llamacpp.WAIT_POLICY == "unset",
              "--wait-policy defaults to unset (%s)" % a.wait_policy)
        p = vs_llamacpp.paths(a)
        check(p["gguf"] is None and p["llama_model"] == p["q4_0"] and p["shoal_model"] == p["shoal"],
              "without --gguf: llama.cpp reads Q4_0, shoal its container (%s)" % p)
        a = vs_llamacpp.parse_args(base + ["--gguf", "Q4_K_M --tensor-type ffn_down_exps=q8_0",
                                           "--shape", "256,4,2,64,256,16,4", "--wait-policy", "passive"])
        p = vs_llamacpp.paths(a)
        name = os.path.basename(p["gguf"] or "")
        check(a.gguf_opts == ("Q4_K_M", ["--tensor-type", "ffn_down_exps=q8_0"]) and
              re.fullmatch(r"L2-s256x4x2x64x256x16x4-q4_k_m-[0-9a-f]{8}\.gguf", name) and
              p["hf"].endswith("hf-L2-s256x4x2x64x256x16x4") and a.shape_obj.hidden == 256 and
              a.shape_obj.experts == 16 and a.shape_obj.top_k == 4 and
              vs_llamacpp.WAIT_POLICY == "passive",
              "--gguf with options and --shape: %s, %s, %s" % (a.gguf_opts, name, p["hf"]))
        a = vs_llamacpp.parse_args(base + ["--gguf", "Q8_0"])
        p = vs_llamacpp.paths(a)
        check(p["llama_model"] == p["shoal_model"] == p["gguf"] == os.path.join(work, "L2-q8_0.gguf") and
              vs_llamacpp.model_files(a) == [p["gguf"]] and vs_llamacpp.llama_label(a) == "Q8_0",
              "--gguf Q8_0: both engines and the eviction on %s (%s)" % (p["gguf"], p))
        for mode in vs_llamacpp.MODES:
            sc = vs_llamacpp.cold_cmd(a, "shoal", 8, mode, "64M")
            lc = vs_llamacpp.cold_cmd(a, "llama", 8, mode, "64M")
            check(sc[sc.index("--model") + 1] == p["gguf"] and "--direct" in sc and
                  sc[sc.index("--expert-cache") + 1] == "64M" and lc[lc.index("-m") + 1] == p["gguf"] and
                  "--no-repack" in lc, "cold %s: both engines on the GGUF: %s | %s" % (mode, sc, lc))
    finally:
        vs_llamacpp.WAIT_POLICY = keep
        # parse_args imported the stub tree's empty gguf package: forget it,
        # so that the GGUF case imports SHOAL_LLAMA_CPP's
        sys.modules.pop("gguf", None)
        sys.path[:] = [x for x in sys.path if x != os.path.join(ok, "gguf-py")]


def write_tiny(hf):
    tok = mc.train_tokenizer(hf, 300, open(os.path.join(ROOT, "README.md")).read() + TEXT * 20)
    check(tok["vocab"] == 300 and tok["merges"] == 300 - 256 - 3 and tok["endoftext"] == 297,
          "tokenizer: 256 bytes + 41 merges + 3 specials (%s)" % tok)
    n = mc.write_hf_model(hf, TINY, 5, tok["endoftext"])
    pc = mc.param_counts(TINY)
    hdr, _, base = mc.read_safetensors(os.path.join(hf, "model.safetensors"))
    check(n == 2 * pc["total"] and os.path.getsize(os.path.join(hf, "model.safetensors")) == base + n,
          "safetensors: %d bytes of BF16 = 2 x %d parameters" % (n, pc["total"]))
    check(len(hdr) == 3 + TINY.layers * (9 + 3 * TINY.experts), "safetensors: %d tensors" % len(hdr))
    check(pc["experts"] == TINY.layers * TINY.experts * 3 * TINY.hidden * TINY.expert_ff,
          "param_counts: experts %d" % pc["experts"])
    return tok


def test_shoal(shoal, tmp, tok):
    hf = os.path.join(tmp, "hf")
    ids = sh([shoal, "tokenize", "--model", hf, "--text", TEXT, "--no-bos"])
    got = [int(x) for x in ids.stdout.split()] if ids.returncode == 0 else []
    check(got and all(0 <= i < tok["vocab"] for i in got) and len(got) < len(TEXT.encode()),
          "tokenize: %d ids < %d bytes, all < %d (%s)" % (len(got), len(TEXT.encode()), tok["vocab"],
                                                          ids.stderr.strip()[-200:]))
    back = sh([shoal, "detokenize", "--model", hf, "--ids", ",".join(map(str, got)), "-n"])
    check(back.returncode == 0 and back.stdout == TEXT,
          "detokenize gives the text back (%r)" % (back.stdout or back.stderr)[-120:])
    sp = sh([shoal, "tokenize", "--model", hf, "--text", "<|endoftext|>", "--no-bos", "--parse-special"])
    check(sp.stdout.split() == [str(tok["endoftext"])], "<|endoftext|> is id %d (%s)" % (
        tok["endoftext"], sp.stdout.strip()))
    box = os.path.join(tmp, "tiny.shoal")
    cmd = [shoal, "convert", hf, box]
    for k, v in vs_llamacpp.SHOAL_DTYPES.items():
        if v:
            cmd += ["--" + k, v]
    r = sh(cmd)
    check(r.returncode == 0, "shoal convert %s (rc %d: %s)" % (" ".join(cmd[4:]), r.returncode,
                                                              r.stderr.strip()[-300:]))
    if r.returncode != 0:
        return len(got)
    ci = vs_llamacpp.benchlib.container_info(box)
    check(ci["experts_dtype"].lower() == vs_llamacpp.SHOAL_DTYPES["experts"] and ci["vocab"] == TINY.vocab,
          "container: experts %s, vocab %d" % (ci["experts_dtype"], ci["vocab"]))
    out_ids = os.path.join(tmp, "ids.txt")
    r = sh([shoal, "run", "--model", box, "--prompt", TEXT, "--max-tokens", "6", "--ignore-eos", "--greedy",
            "--threads", "2", "--no-echo", "--ids-out", out_ids])
    gen = [int(x) for x in open(out_ids).read().split()] if r.returncode == 0 else []
    check(len(gen) == 6 and all(0 <= i < TINY.vocab for i in gen),
          "shoal run --greedy: 6 ids in range %s (rc %d: %s)" % (gen, r.returncode, r.stderr.strip()[-300:]))
    stats = vs_llamacpp.parse_shoal_run(r.stderr)
    check(stats.get("prompt_tokens") == len(got) and stats.get("decode_tokens") in (5, 6),
          "the tool reads shoal run's statistics line: %s" % stats)
    return len(got)


def test_gguf(tmp, tok, n_prompt):
    tree = os.environ.get("SHOAL_LLAMA_CPP")
    if not tree or not os.path.isfile(os.path.join(tree, "gguf-py", "gguf", "__init__.py")):
        print("skip GGUF writer: set SHOAL_LLAMA_CPP to a llama.cpp source tree (its gguf-py is used; "
              "nothing is built) to check the GGUF written")
        return
    gguf = vs_llamacpp.import_gguf(tree)
    hf = os.path.join(tmp, "hf")
    out = os.path.join(tmp, "tiny.gguf")
    n = mc.write_gguf(hf, out, gguf)
    L, H, E, F = TINY.layers, TINY.hidden, TINY.experts, TINY.expert_ff
    check(n == 3 + 12 * L, "GGUF: %d tensors, expected 3 + 12 x %d" % (n, L))
    rd = gguf.GGUFReader(out)
    t = {x.name: x for x in rd.tensors}
    check(len(t) == n, "GGUF reads back %d tensors" % len(t))
    want = {"token_embd.weight": ([H, TINY.vocab], "BF16"), "output.weight": ([H, TINY.vocab], "BF16"),
            "output_norm.weight": ([H], "F32"),
            "blk.1.attn_q.weight": ([H, TINY.heads * TINY.head_dim], "BF16"),
            "blk.1.attn_k.weight": ([H, TINY.kv_heads * TINY.head_dim], "BF16"),
            "blk.1.attn_q_norm.weight": ([TINY.head_dim], "F32"),
            "blk.1.ffn_gate_inp.weight": ([H, E], "F32"),
            "blk.1.ffn_gate_exps.weight": ([H, F, E], "BF16"), "blk.1.ffn_up_exps.weight": ([H, F, E], "BF16"),
            "blk.1.ffn_down_exps.weight": ([F, H, E], "BF16")}
    for name, (shape, typ) in want.items():
        x = t.get(name)
        got = (list(map(int, x.shape)), x.tensor_type.name) if x is not None else None
        check(got == (shape, typ), "GGUF %s: %s, expected %s" % (name, got, (shape, typ)))
    hdr, mm, base = mc.read_safetensors(os.path.join(hf, "model.safetensors"))
    a, b = hdr["model.layers.1.mlp.experts.5.down_proj.weight"]["data_offsets"]
    src = np.frombuffer(mm[base + a: base + b], dtype=np.uint16)
    exps = np.asarray(t["blk.1.ffn_down_exps.weight"].data).view(np.uint16).reshape(E, -1)
    check(np.array_equal(exps[5], src), "GGUF: expert 5's down_proj bits are the safetensors' bits")
    f = rd.fields
    toks = f["tokenizer.ggml.tokens"]
    pre = f["tokenizer.ggml.pre"]
    check(len(toks.data) == TINY.vocab and bytes(pre.parts[pre.data[0]]).decode() == "qwen2",
          "GGUF vocabulary: %d tokens (padded from %d), pre-tokenizer qwen2" % (len(toks.data), tok["vocab"]))
    cli = os.path.join(tree, "build", "bin", "llama-completion")
    if not all(os.access(os.path.join(tree, "build", "bin", b), os.X_OK) for b in vs_llamacpp.LLAMA_BINARIES):
        print("skip llama.cpp runs of the GGUF: no %s" % os.path.join(tree, "build", "bin"))
        return
    r = sh([cli, "-m", out, "-p", TEXT, "-n", "4", "--ignore-eos", "-t", "2", "--temp", "0", "-no-cnv",
            "--no-display-prompt"])
    st = vs_llamacpp.parse_llama_completion(r.stderr)
    check(r.returncode == 0 and st.get("prompt_tokens") == n_prompt,
          "llama.cpp runs the GGUF and reads the prompt as the same %d tokens: %s (rc %d: %s)" % (
              n_prompt, st, r.returncode, r.stderr.strip()[-300:] if r.returncode else ""))
    test_gguf_steps(tree, tmp)


def test_gguf_steps(tree, tmp):
    """The tool's convert and warm steps with --gguf Q8_0 on the tiny
    checkpoint: llama-quantize makes the file, both engines read it."""
    work = os.path.join(tmp, "work-steps")
    shape = "%d,%d,%d,%d,%d,%d,%d" % (TINY.hidden, TINY.heads, TINY.kv_heads, TINY.head_dim, TINY.expert_ff,
                                      TINY.experts, TINY.top_k)
    args = ["--llama-cpp", tree, "--shoal", SHOAL, "--work", work, "--layers", str(TINY.layers),
            "--shape", shape, "--gguf", "Q8_0", "--alternations", "1", "--gen", "4", "--prefill", "8",
            "--threads", "2", "--out", os.path.join(work, "r.json")]
    p = vs_llamacpp.paths(vs_llamacpp.parse_args(args))
    shutil.copytree(os.path.join(tmp, "hf"), p["hf"])
    r = sh([sys.executable, BENCH, "--steps", "convert,warm"] + args, timeout=600)
    res = json.load(open(os.path.join(work, "r.json"))) if os.path.exists(os.path.join(work, "r.json")) else {}
    smoke = (res.get("convert") or {}).get("smoke") or {}
    check(r.returncode == 0 and os.path.exists(p["gguf"]) and not os.path.exists(p["shoal"]) and
          smoke.get("shoal", {}).get("rc") == 0 and smoke.get("llama", {}).get("rc") == 0,
          "--gguf Q8_0 convert: %s made, no container, both engines ran it (rc %d: %s)" % (
              p["gguf"], r.returncode, r.stderr.strip()[-400:]))
    warm = res.get("warm") or []
    check(len(warm) == 2 and all(w["rc"] == 0 and (w.get("decode_tok_s") or 0) > 0 for w in warm) and
          all(p["gguf"] in c for w in warm for c in w["cmds"]) and
          res["bits_per_weight"]["llama"]["experts_types"] == ["Q8_0"] and
          res["bits_per_weight"]["shoal"]["same_file"],
          "--gguf Q8_0 warm: both engines on %s: %s" % (p["gguf"], [
              {k: w.get(k) for k in ("engine", "rc", "decode_tok_s", "cmds", "err_tail")} for w in warm]))


def test_summary():
    """The table's arithmetic on made-up runs: medians, ratios per alternation,
    bytes per decode token from the short run, over-limit runs left out."""
    la = [1.0, 1.0, 1.0]

    def rec(eng, alt, tok, rb, n=64, **kw):
        return dict(engine=eng, alt=alt, rc=0, decode_tok_s=tok, read_bytes=rb, n_gen=n, maxrss_mb=100,
                    load_before=la, load_after=la, **kw)
    runs = [rec("shoal", 0, 4.0, 640e6), rec("llama", 0, 1.0, 6400e6),
            rec("llama", 1, 2.0, 6400e6), rec("shoal", 1, 6.0, 640e6),
            rec("shoal", 2, 5.0, 640e6), rec("llama", 2, 20.0, 1e6, over_limit=True),
            rec("llama", "short", 1.0, 1600e6, n=16), rec("shoal", "short", 4.0, 160e6, n=16)]
    bpt = {e: vs_llamacpp.decode_bytes_per_token(runs, e) for e in ("shoal", "llama")}
    r = vs_llamacpp.row("cold", runs, "decode_tok_s", bpt)
    check(r["shoal"]["median"] == 5.0 and r["llama"]["median"] == 1.5 and r["llama"]["n"] == 2 and
          r["llama_over_limit"] == 1, "row: medians 5.0 / 1.5, the over-limit run left out (%s)" % r)
    check(abs(r["ratio"] - 5.0 / 1.5) < 1e-9 and r["ratios_per_alternation"] == [4.0, 3.0],
          "row: ratio of medians %.3f, per alternation %s" % (r["ratio"], r["ratios_per_alternation"]))
    check(bpt["shoal"]["decode_per_token"] == 10e6 and bpt["llama"]["decode_per_token"] == 100e6,
          "bytes per decode token: (long - short) / 48 = 10 MB and 100 MB (%s)" % bpt)


def test_bound_ratios():
    """Decode against the RAM-read bound on made-up runs: the better probe beside
    each decode run, shoal's bytes a token; for llama.cpp on one file the same
    weights with its KV rows in f16 (half of shoal's f32 rows), on two files its
    weights scaled by the bits per weight."""
    class A:
        kv = "f16"

    def rec(eng, alt, tok, probes, mb=None, kv=None):
        return dict(engine=eng, alt=alt, rc=0, decode_tok_s=tok, ram_read_gbs=probes,
                    decode_token_read_mb=mb, decode_token_kv_read_mb=kv)
    res = {"bits_per_weight": {"shoal": {"same_file": True, "bpw": 4.76}, "llama": {"bpw": 4.76}},
           "warm": [rec("shoal", 0, 100.0, [20.0, 30.0], 300.0, 20.0), rec("llama", 0, 90.0, [None, 28.0])]}
    check(vs_llamacpp.bound_ratios(A, res), "bound ratios set")
    s, ll = res["warm"]
    check(abs(s["bound_tok_s"] - 100.0) < 1e-9 and abs(s["decode_bound_ratio"] - 1.0) < 1e-9,
          "shoal: 30 GB/s over 300 MB is 100 tok/s, ratio 1.0 (%s)" % s)
    check(abs(ll["bound_tok_s"] - 28e3 / 290.0) < 1e-9,
          "llama.cpp on the same file: 28 GB/s over 280 + 10 MB of f16 KV (%s)" % ll)
    res["bits_per_weight"] = {"shoal": {"same_file": False, "bpw": 4.5}, "llama": {"bpw": 4.5 * 1.1}}
    del ll["bound_tok_s"]
    vs_llamacpp.bound_ratios(A, res)
    check(abs(ll["bound_tok_s"] - 28e3 / (280.0 * 1.1 + 20.0)) < 1e-9,
          "llama.cpp on its own file: weights x 1.1, the same f16 KV (%s)" % ll)
    res["warm"] = [rec("shoal", 0, 100.0, [None, None], 300.0, 20.0)]
    check(not vs_llamacpp.bound_ratios(A, res), "no probe: no bound")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    a = ap.parse_args()
    global SHOAL
    SHOAL = os.path.abspath(a.shoal)
    with tempfile.TemporaryDirectory(prefix="shoal-vsll-") as tmp:
        test_arguments(a.shoal, tmp)
        test_summary()
        test_bound_ratios()
        test_wait_policy()
        test_gguf_mode(os.path.abspath(a.shoal), tmp)
        tok = write_tiny(os.path.join(tmp, "hf"))
        n_prompt = test_shoal(a.shoal, tmp, tok)
        test_gguf(tmp, tok, n_prompt)
    return result.summary()


if __name__ == "__main__":
    sys.exit(main())
