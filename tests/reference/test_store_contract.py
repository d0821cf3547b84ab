#!/usr/bin/env python3
"""DESIGN contract 1 for the container and expert store.

For every family's tiny checkpoint: convert to containers (f32 and bf16
experts; int8 and int4 experts with int8 dense), then require that the
logits bytes of a 12-step greedy run are identical to a baseline (unlimited
cache, one thread) when one store knob at a time changes -- expert cache
0 / small, cache policy lru / freq, pinned hot-set on, I/O engine uring / pread, O_DIRECT on,
prefetch off, a mirror on, two threads -- and for a few combinations of
them; and that the f32 container matches the Hugging Face directory byte
for byte.
Also: a flipped byte in experts.bin is reported with file, layer, expert
and offset; a damaged mirror copy falls back to the container with a
warning and the same logits; a mirror of another model is refused; a
missing mirror is reported once and ignored; --stats reports every tier,
source and prefetch precision/recall; --cache-policy freq keeps misses
out of a small cache that lru fills, with the same logits; a truncated experts.bin is refused
at open; convert refuses to overwrite without --force and leaves no
half-written output on failure.

Runs use shoal's own OpenMP wait policy, the one users get (it holds on a
loaded machine; common/base/omp_env.h).

Usage: /usr/bin/python3 tests/reference/test_store_contract.py --shoal BIN
"""
import argparse
import json
import os
import re
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # tests/: harness
import harness as H  # noqa: E402
ROOT = os.path.dirname(os.path.dirname(HERE))
FAMILIES = ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe"]
PROMPT = "17,300,3,101,257,42,7"



def dense4_layout(ct, dense):
    """A --dense int4/int4a8 container keeps its routers (and shared-expert
    gates) INT8, its 1-D tensors F32, and every other dense tensor 4-bit."""
    with open(os.path.join(ct, "shoal.json")) as f:
        man = json.load(f)
    want4 = dense.upper()
    bad = []
    for t in man["dense"]["tensors"]:
        name, dt = t["name"], t["dtype"]
        if len(t["shape"]) == 1:
            exp = "F32"
        elif name.endswith(".router") or name.endswith(".shexp_gate"):
            exp = "INT8"
        else:
            exp = want4
        if dt != exp:
            bad.append("%s is %s, expected %s" % (name, dt, exp))
    n4 = sum(1 for t in man["dense"]["tensors"] if t["dtype"] == want4)
    if bad:
        return False, "; ".join(bad[:3])
    return n4 > 0, "%d %s tensors" % (n4, want4)

result = H.Results(skips=True)


run = H.run   # output captured, 300 s


def logits(shoal, model, out, *extra, env=None):
    r = run([shoal, "run", "--model", model, "--tokens", PROMPT, "--max-tokens", "12",
             "--greedy", "--ignore-eos", "--logits-out", out] + list(extra), env=env)
    if r.returncode != 0:
        return None, r.stderr.strip()
    return open(out, "rb").read(), r.stderr


ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def knob_variants(mirror):
    """(name, extra flags, env): one knob at a time, then combinations."""
    return [
        ("cache=0", ["--expert-cache", "0"], ONE_THREAD),
        ("cache=64K", ["--expert-cache", "64K"], ONE_THREAD),
        ("cache=64K policy=lru", ["--expert-cache", "64K", "--cache-policy", "lru"], ONE_THREAD),
        ("cache=64K policy=freq", ["--expert-cache", "64K", "--cache-policy", "freq"],
         ONE_THREAD),
        ("cache=16K policy=freq", ["--expert-cache", "16K", "--cache-policy", "freq"],
         ONE_THREAD),
        ("pin=48K cache=0", ["--pin", "48K", "--expert-cache", "0"], ONE_THREAD),
        ("pin=unlimited", ["--pin", "unlimited"], ONE_THREAD),
        ("io=pread", ["--io", "pread"], ONE_THREAD),
        ("io=uring", ["--io", "uring"], ONE_THREAD),
        ("direct=on", ["--direct", "on"], ONE_THREAD),
        ("prefetch=off", ["--prefetch", "off"], ONE_THREAD),
        ("mirror", ["--mirror", mirror, "--mirror-weights", "1,1"], ONE_THREAD),
        ("threads=2", [], {"OMP_NUM_THREADS": "2"}),
        ("cache=0 pin=32K pread direct mirror qd=2 threads=2",
         ["--expert-cache", "0", "--pin", "32K", "--io", "pread", "--direct", "on",
          "--mirror", mirror, "--queue-depth", "2"], {"OMP_NUM_THREADS": "2"}),
        ("cache=64K uring direct prefetch=off mirror(probe) qd=1",
         ["--expert-cache", "64K", "--io", "uring", "--direct", "on", "--prefetch", "off",
          "--mirror", mirror, "--queue-depth", "1"], ONE_THREAD),
        ("cache=16K pin=16K uring prefetch threads=2",
         ["--expert-cache", "16K", "--pin", "16K", "--io", "uring", "--mirror-weights", "1"],
         {"OMP_NUM_THREADS": "2"}),
        ("cache=32K policy=freq pin=16K pread direct qd=2 threads=2",
         ["--expert-cache", "32K", "--cache-policy", "freq", "--pin", "16K", "--io", "pread",
          "--direct", "on", "--queue-depth", "2"], {"OMP_NUM_THREADS": "2"}),
    ]


def flip(path, off):
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0xFF]))


def mirror_checks(shoal, tmp, ct):
    """Mirror behaviour on one container (ct has no damage)."""
    ref, err = logits(shoal, ct, os.path.join(tmp, "mref.npy"), env=ONE_THREAD)
    if ref is None:
        result("mirror checks: baseline run", False, err)
        return
    # a damaged copy: every expert of layer 0 flipped on the mirror
    bad = os.path.join(tmp, "mirror-damaged")
    shutil.copytree(ct, bad)
    with open(os.path.join(ct, "shoal.json")) as f:
        man = json.load(f)
    ex = man["experts"]
    off0 = ex["layers"][0]["offset"]
    for ie in range(ex["n_expert"]):
        flip(os.path.join(bad, "experts.bin"), off0 + ie * ex["blob_bytes"] + 5)
    got, err = logits(shoal, ct, os.path.join(tmp, "m.npy"), "--mirror", bad,
                      "--mirror-weights", "1,1000", "--expert-cache", "0", env=ONE_THREAD)
    warns = [ln for ln in err.splitlines() if "reading it from" in ln] if got is not None else []
    result("damaged mirror copy: same logits, fallback warned (at most 3 lines)",
           got == ref and 1 <= len(warns) <= 3 and "checksum mismatch" in warns[0]
           if warns else False, err.strip()[-400:])
    # another model as a mirror is refused
    other = os.path.join(tmp, "mixtral-int4")
    r = run([shoal, "run", "--model", ct, "--tokens", PROMPT, "--max-tokens", "2",
             "--mirror", other])
    result("mirror of another model is refused", r.returncode == 1 and "another model" in r.stderr
           and other in r.stderr, r.stderr.strip())
    # a missing mirror: one warning, same logits
    gone = os.path.join(tmp, "no-such-mirror")
    got, err = logits(shoal, ct, os.path.join(tmp, "m.npy"), "--mirror", gone, env=ONE_THREAD)
    lines = [ln for ln in (err or "").splitlines() if gone in ln]
    result("missing mirror reported once and ignored", got == ref and len(lines) == 1,
           (err or "").strip()[-400:])
    # --stats: tiers, sources, prefetch precision and recall
    good = os.path.join(tmp, "mirror-good")
    shutil.copytree(ct, good)
    got, err = logits(shoal, ct, os.path.join(tmp, "m.npy"), "--stats", "--mirror", good,
                      "--pin", "16K", "--expert-cache", "32K", env=ONE_THREAD)
    want = ["pinned", "cache", "disk", "MB/s", "ms/token", "source 0", "source 1",
            "precision", "recall"]
    missing = [w for w in want if err is None or w not in err]
    result("--stats reports tiers, sources, bandwidth, stall, precision and recall",
           got == ref and not missing, "missing %s" % missing if missing else "")
    # the policies keep different experts (freq keeps some misses out of a
    # small cache), and the logits stay the same
    seen = {}
    for pol in ("lru", "freq"):
        got, err = logits(shoal, ct, os.path.join(tmp, "m.npy"), "--stats", "--cache-policy",
                          pol, "--expert-cache", "32K", "--prefetch", "off", env=ONE_THREAD)
        m = re.search(r"\((\w+): \d+ experts, (\d+) evictions, (\d+) not admitted\)",
                      err or "")
        seen[pol] = (got == ref, m.groups() if m else None)
    result("--cache-policy lru|freq: same logits; freq keeps misses out, lru evicts",
           all(v[0] for v in seen.values()) and seen["lru"][1] and seen["freq"][1] and
           seen["lru"][1][0] == "lru" and seen["lru"][1][2] == "0" and
           int(seen["lru"][1][1]) > 0 and seen["freq"][1][0] == "freq" and
           int(seen["freq"][1][2]) > 0 and int(seen["freq"][1][1]) < int(seen["lru"][1][1]),
           str(seen))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    a = ap.parse_args()
    shoal = os.path.abspath(a.shoal)
    tmp = tempfile.mkdtemp(prefix="shoal-contract-")
    try:
        r = run(["/usr/bin/python3", os.path.join(HERE, "gen_tiny.py"), os.path.join(tmp, "hf"),
                 "--only", ",".join(FAMILIES)])
        if r.returncode != 0:
            result("generate tiny checkpoints", False, r.stderr[-500:])
            return 1
        for fam in FAMILIES:
            hf = os.path.join(tmp, "hf", fam)
            base, err = logits(shoal, hf, os.path.join(tmp, "base.npy"), env=ONE_THREAD)
            if base is None:
                result(fam + " hf run", False, err)
                continue
            for experts, dense in [("f32", "f32"), ("bf16", "bf16"), ("int8", "int8"), ("int4", "int8"),
                                   ("int4a8", "int8"), ("int4a8", "int4a8"), ("int4", "int4")]:
                ct = os.path.join(tmp, "%s-%s" % (fam, experts))
                if dense in ("int4", "int4a8"):
                    ct += "-dense4"
                r = run([shoal, "convert", hf, ct, "--experts", experts, "--dense", dense, "--group", "32"])
                if r.returncode != 0:
                    result("%s convert %s" % (fam, experts), False, r.stderr.strip())
                    continue
                ref, err = logits(shoal, ct, os.path.join(tmp, "ref.npy"), "--expert-cache",
                                  "unlimited", env=ONE_THREAD)
                if ref is None:
                    result("%s %s run" % (fam, experts), False, err)
                    continue
                if experts == "f32":
                    result("%s f32 container == hf dir" % fam, ref == base)
                if dense in ("int4", "int4a8"):
                    result("%s dense %s: trunk 4-bit, routers int8, 1-D f32" % (fam, dense),
                           *dense4_layout(ct, dense))
                mirror = ct + "-mirror"
                shutil.copytree(ct, mirror)
                same, bad = True, []
                for name, extra, env in knob_variants(mirror):
                    got, err = logits(shoal, ct, os.path.join(tmp, "x.npy"), *extra, env=env)
                    if got != ref:
                        same = False
                        bad.append("%s: %s" % (name, err.strip()[-300:] if got is None
                                               else "logits differ"))
                result("%s %s: identical logits over cache/pin/io/direct/prefetch/mirror/threads"
                       % (fam, experts), same, "; ".join(bad[:3]))
                shutil.rmtree(mirror)
        mirror_checks(shoal, tmp, os.path.join(tmp, "qwen3_moe-int4"))
        # bad input on one container
        ct = os.path.join(tmp, "qwen3_moe-int4")
        broken = os.path.join(tmp, "broken")
        shutil.copytree(ct, broken)
        ex = os.path.join(broken, "experts.bin")
        with open(ex, "r+b") as f:
            f.seek(4096 + 100)
            b = f.read(1)
            f.seek(4096 + 100)
            f.write(bytes([b[0] ^ 0xFF]))
        r = run([shoal, "run", "--model", broken, "--tokens", PROMPT, "--max-tokens", "4", "--greedy"])
        msg = r.stderr.strip()
        result("checksum mismatch is reported", r.returncode == 1 and "checksum mismatch" in msg
               and "experts.bin" in msg and "layer 0 expert 0" in msg and "offset 4096" in msg, msg)
        r = run([shoal, "inspect", broken, "--verify"])
        result("inspect --verify finds it", r.returncode == 1 and "layer 0 expert 0" in r.stderr, r.stderr.strip())
        with open(ex, "r+b") as f:
            f.truncate(os.path.getsize(ex) - 4096)
        r = run([shoal, "run", "--model", broken, "--tokens", PROMPT, "--max-tokens", "4"])
        result("truncated experts.bin refused at open", r.returncode == 1 and "truncated" in r.stderr
               and len(r.stderr.strip().splitlines()) == 1, r.stderr.strip())
        # manifests that break the INT4A8 rules: refused at open, one line each
        a8 = os.path.join(tmp, "qwen3_moe-int4a8")
        for what, edit, want in [
                ("INT4A8 on a 1-D dense tensor", lambda m: m["dense"]["tensors"][1].update(
                    dtype="INT4A8", group=32), "needs a 2-D shape and group 32, 64 or 128; found 1-D, group 32"),
                ("experts group 48", lambda m: m["experts"].update(group=48),
                 "expected group 32, 64 or 128")]:
            bad = os.path.join(tmp, "bad-a8")
            shutil.copytree(a8, bad)
            mp = os.path.join(bad, "shoal.json")
            m = json.load(open(mp))
            edit(m)
            json.dump(m, open(mp, "w"))
            r = run([shoal, "inspect", bad])
            result("%s refused at open" % what, r.returncode == 1 and want in r.stderr and
                   len(r.stderr.strip().splitlines()) == 1, r.stderr.strip())
            shutil.rmtree(bad)
        r = run([shoal, "convert", os.path.join(tmp, "hf", "qwen3_moe"), ct])
        result("convert refuses to overwrite", r.returncode == 1 and "--force" in r.stderr, r.stderr.strip())
        # a failing conversion (source tensor removed mid-way is hard; use a bad
        # source) leaves nothing behind
        bad_src = os.path.join(tmp, "badsrc")
        shutil.copytree(os.path.join(tmp, "hf", "qwen3_moe"), bad_src)
        with open(os.path.join(bad_src, "config.json"), "a") as f:
            f.write("garbage")
        out = os.path.join(tmp, "never")
        r = run([shoal, "convert", bad_src, out])
        leftovers = [n for n in os.listdir(tmp) if n.startswith("never")]
        result("failed convert leaves no output", r.returncode == 1 and not leftovers, r.stderr.strip())
        # full disk during convert: a 160 KiB tmpfs cannot hold the container
        if os.geteuid() == 0 and shutil.which("mount"):
            mnt = os.path.join(tmp, "small")
            os.mkdir(mnt)
            if run(["mount", "-t", "tmpfs", "-o", "size=160k", "tmpfs", mnt]).returncode == 0:
                try:
                    dst = os.path.join(mnt, "model")
                    r = run([shoal, "convert", os.path.join(tmp, "hf", "qwen3_moe"), dst,
                             "--experts", "f32", "--dense", "f32"])
                    left = os.listdir(mnt)
                    result("full disk: convert fails and leaves nothing", r.returncode == 1
                           and "No space left" in r.stderr and not left,
                           "%s left=%s" % (r.stderr.strip(), left))
                finally:
                    run(["umount", mnt])
            else:
                result.skip("full-disk convert", "cannot mount a tmpfs here")
        else:
            result.skip("full-disk convert", "needs root to mount a small tmpfs")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return result.summary()


if __name__ == "__main__":
    sys.exit(main())
