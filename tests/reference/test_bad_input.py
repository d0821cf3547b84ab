#!/usr/bin/python3
"""Broken checkpoints and bad requests must give a clear one-line error, never a crash.

usage: /usr/bin/python3 tests/reference/test_bad_input.py --shoal PATH/TO/shoal
           [--workdir DIR] [--timeout SECONDS] [--configs DIR]

Each case copies a tiny checkpoint from gen_tiny.py (qwen3_moe; mixtral for the
sharded case), breaks one thing, runs

    SHOAL run --model DIR --tokens 17,300,3 --max-tokens 2 --greedy \
              --logits-out OUT.npy --ids-out IDS.txt   [case-specific args]

and asserts: exit status > 0 and not a signal (negative / >= 128), finishes within
the timeout, stderr has exactly one non-empty line, that line contains the
expected context (file / tensor / field / model_type ...), and stderr shows no
"Sanitizer", "Segmentation", "core dumped", "Aborted" or "Traceback".
Ends with "N passed, M failed"; exit status 1 if anything failed.
"""

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gen_tiny  # noqa: E402

CRASH_MARKERS = ("Sanitizer", "Segmentation", "core dumped", "Aborted", "Traceback")
BASE_TOKENS = [17, 300, 3]


# ---------------------------------------------------------------- safetensors edit helpers

def st_read(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def st_write(path, header, data):
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def st_rebuild(path, edit):
    """edit(list of [name, info, bytes]) -> list; rewrites the file with fresh offsets."""
    header, data = st_read(path)
    meta = header.pop("__metadata__", None)
    items = [[k, dict(v), bytes(data[v["data_offsets"][0]:v["data_offsets"][1]])] for k, v in header.items()]
    items = edit(items)
    nh = {"__metadata__": meta} if meta is not None else {}
    off, blobs = 0, []
    for k, info, b in items:
        info["data_offsets"] = [off, off + len(b)]
        nh[k] = info
        off += len(b)
        blobs.append(b)
    st_write(path, nh, b"".join(blobs))


# ---------------------------------------------------------------- cases

ST = "model.safetensors"
TRUNC_WORDS = ("truncat", "short", "beyond", "exceed", "past", "end of file", "eof", "offset", "size")


def c_missing_tensor(d):
    name = "model.layers.1.mlp.experts.5.down_proj.weight"
    st_rebuild(os.path.join(d, ST), lambda it: [x for x in it if x[0] != name])
    return [name], []


def c_extra_tensor(d):
    name = "model.layers.0.mlp.experts.16.up_proj.weight"   # experts are 0..15

    def ed(it):
        src = next(x for x in it if x[0] == "model.layers.0.mlp.experts.15.up_proj.weight")
        return it + [[name, dict(src[1]), src[2]]]
    st_rebuild(os.path.join(d, ST), ed)
    return [name], []


def c_misshaped_tensor(d):
    name = "model.layers.0.self_attn.k_proj.weight"         # [32, 64] -> [64, 32]

    def ed(it):
        for x in it:
            if x[0] == name:
                x[1]["shape"] = list(reversed(x[1]["shape"]))
        return it
    st_rebuild(os.path.join(d, ST), ed)
    return [name], []


def c_bad_dtype(d):
    name = "model.norm.weight"

    def ed(it):
        for x in it:
            if x[0] == name:
                n = len(x[2]) // 4
                x[1]["dtype"] = "I64"
                x[2] = struct.pack(f"<{n}q", *range(n))
        return it
    st_rebuild(os.path.join(d, ST), ed)
    return [name, "I64"], []


def c_offsets_out_of_range(d):
    name = "model.layers.2.self_attn.o_proj.weight"
    p = os.path.join(d, ST)
    header, data = st_read(p)
    b, e = header[name]["data_offsets"]
    header[name]["data_offsets"] = [len(data) - 8, len(data) - 8 + (e - b)]
    st_write(p, header, data)
    return [name, TRUNC_WORDS], []


def c_header_len_beyond_file(d):
    p = os.path.join(d, ST)
    raw = bytearray(open(p, "rb").read())
    raw[:8] = struct.pack("<Q", len(raw) + 4096)
    open(p, "wb").write(raw)
    return [ST, "header"], []


def c_header_not_json(d):
    p = os.path.join(d, ST)
    raw = bytearray(open(p, "rb").read())
    (n,) = struct.unpack("<Q", raw[:8])
    raw[8:8 + 16] = b"\x00\xffnot json at all"[:16].ljust(16, b"#")
    open(p, "wb").write(raw)
    return [ST, "header"], []


def c_truncated(d):
    p = os.path.join(d, ST)
    sz = os.path.getsize(p)
    with open(p, "r+b") as f:
        f.truncate(int(sz * 0.6))
    return [ST, TRUNC_WORDS], []


def c_malformed_config(d):
    p = os.path.join(d, "config.json")
    txt = open(p).read()
    open(p, "w").write(txt[: len(txt) // 2])
    return ["config.json", ("json", "parse", "malformed", "syntax", "invalid", "unexpected end")], []


def c_bad_field_type(d):
    p = os.path.join(d, "config.json")
    cfg = json.load(open(p))
    cfg["num_attention_heads"] = "sixteen"
    json.dump(cfg, open(p, "w"), indent=2)
    return ["num_attention_heads"], []


def c_unknown_model_type(d):
    p = os.path.join(d, "config.json")
    cfg = json.load(open(p))
    cfg["model_type"] = "deepseek_v9000"
    json.dump(cfg, open(p, "w"), indent=2)
    return ["deepseek_v9000", "mixtral", "qwen2_moe", "qwen3_moe", "olmoe"], []


def c_prompt_exceeds_ctx(d):
    return [("ctx", "context"), "20", "8"], ["--ctx", "8", "--tokens", ",".join(str(i) for i in range(1, 21))]


def c_token_out_of_range(d):
    return ["99999"], ["--tokens", "17,99999,3"]


def c_missing_shard(d):
    fn = "model-00002-of-00002.safetensors"
    os.remove(os.path.join(d, fn))
    return [fn], []


# name -> (base checkpoint, mutate)
CASES = [
    ("missing tensor", "qwen3_moe", c_missing_tensor),
    ("extra unexpected tensor", "qwen3_moe", c_extra_tensor),
    ("mis-shaped tensor", "qwen3_moe", c_misshaped_tensor),
    ("unsupported dtype I64", "qwen3_moe", c_bad_dtype),
    ("tensor data_offsets beyond data", "qwen3_moe", c_offsets_out_of_range),
    ("safetensors header length beyond file", "qwen3_moe", c_header_len_beyond_file),
    ("safetensors header not JSON", "qwen3_moe", c_header_not_json),
    ("file truncated mid-data", "qwen3_moe", c_truncated),
    ("malformed config.json", "qwen3_moe", c_malformed_config),
    ("config field of wrong type", "qwen3_moe", c_bad_field_type),
    ("unknown model_type", "qwen3_moe", c_unknown_model_type),
    ("prompt longer than --ctx", "qwen3_moe", c_prompt_exceeds_ctx),
    ("token id out of range", "qwen3_moe", c_token_out_of_range),
    ("shard listed in index missing", "mixtral", c_missing_shard),
]


def run_case(shoal, d, extra, expect, out_dir, timeout):
    args = ["--model", d, "--tokens", ",".join(map(str, BASE_TOKENS)), "--max-tokens", "2", "--greedy",
            "--logits-out", os.path.join(out_dir, "bad.npy"), "--ids-out", os.path.join(out_dir, "bad.txt")]
    # case-specific args override (later occurrence of --tokens replaces the earlier one)
    i = 0
    while i < len(extra):
        if extra[i] in args:
            args[args.index(extra[i]) + 1] = extra[i + 1]
        else:
            args += extra[i:i + 2]
        i += 2
    cmd = [shoal, "run"] + args
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, errors="replace")
    except subprocess.TimeoutExpired:
        return False, f"hung: no exit within {timeout}s"
    except OSError as e:
        return False, f"cannot execute {shoal}: {e}"
    err = p.stderr or ""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    problems = []
    if p.returncode == 0:
        problems.append("exit status 0 (expected failure)")
    elif p.returncode < 0 or p.returncode >= 128:
        problems.append(f"killed by a signal / crash (exit status {p.returncode})")
    crash = [m for m in CRASH_MARKERS if m in err]
    if crash:
        problems.append(f"crash markers in stderr: {crash}")
    if len(lines) != 1:
        problems.append(f"stderr has {len(lines)} non-empty lines, expected exactly 1")
    for e in expect:
        alts = e if isinstance(e, tuple) else (e,)
        if not any(x.lower() in err.lower() for x in alts):
            problems.append(f"stderr does not mention {' or '.join(repr(x) for x in alts)}")
    shown = " | ".join(lines[:3]) + (" | ..." if len(lines) > 3 else "")
    if problems:
        return False, "; ".join(problems) + f"  [rc={p.returncode}] stderr: {shown!r}"
    return True, f"rc={p.returncode}: {shown}"


def main():
    ap = argparse.ArgumentParser(description="shoal bad-input handling")
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--workdir")
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--configs", default=gen_tiny.DEFAULT_CONFIGS)
    a = ap.parse_args()
    shoal = os.path.abspath(a.shoal) if os.path.sep in a.shoal else (shutil.which(a.shoal) or a.shoal)

    passed = failed = skipped = 0
    work = a.workdir or tempfile.mkdtemp(prefix="shoal-bad-")
    os.makedirs(work, exist_ok=True)
    try:
        bases = sorted({b for _, b, _ in CASES})
        man, _ = gen_tiny.generate(os.path.join(work, "base"), a.configs, bases, verbose=False)
        out_dir = os.path.join(work, "out")
        os.makedirs(out_dir, exist_ok=True)
        for i, (title, base, fn) in enumerate(CASES):
            info = man["models"].get(base, {})
            if "skipped" in info:
                print(f"SKIP: {title}: ../shared/data/configs not found ({info['skipped']})")
                skipped += 1
                continue
            if "failed" in info:
                print(f"FAIL {title}: base checkpoint {base} could not be generated")
                failed += 1
                continue
            d = os.path.join(work, f"case{i:02d}")
            shutil.rmtree(d, ignore_errors=True)
            shutil.copytree(os.path.join(work, "base", base), d)
            expect, extra = fn(d)
            ok, msg = run_case(shoal, d, extra, expect, out_dir, a.timeout)
            print(f"{'PASS' if ok else 'FAIL'} {title}: {msg}")
            passed += ok
            failed += not ok
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    if skipped:
        print(f"({skipped} skipped)")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
