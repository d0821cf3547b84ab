#!/usr/bin/env python3
"""`shoal shard`: partial containers per worker (docs/FORMAT.md "Shards").

On a container converted from the bundled model (4 MoE layers x 8 experts)
and a synthetic one with 4 x 128 experts (`shoal synth`):
- 3 workers with 2 replicas and 3 with 1: every expert is held by exactly R
  shards, the union covers the model, placement.json agrees with the
  shards' manifests, each held blob's bytes (read here at the offsets the
  format document gives) equal the full container's, `shoal inspect
  --verify` passes on each shard and each shard keeps the full model's
  fingerprint and checksums;
- weights 3,1,1 give worker 0 about 3/5 of the experts;
- --with-dense copies dense.bin byte for byte; a shard without it is
  refused by `shoal run` with a message naming the full container;
- existing outputs need --force; a damaged source blob stops the run with
  the layer and expert named and leaves no temporary directory;
- bad inputs exit 2 with a one-line error and write nothing.

Usage: /usr/bin/python3 tests/reference/test_shard.py --shoal BIN
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # tests/: harness
import harness as H  # noqa: E402
ROOT = os.path.dirname(os.path.dirname(HERE))
MODEL = os.path.join(ROOT, "models", "shakespeare-moe")
HEADER = 4096


result = H.Results()


run = H.run   # output captured, 300 s


def manifest(d):
    with open(os.path.join(d, "shoal.json")) as f:
        return json.load(f)


def held_sets(m):
    """{layer: [expert ids]} a manifest's experts.bin holds."""
    ex = m["experts"]
    if "shard" not in m:
        return {l["layer"]: list(range(ex["n_expert"])) for l in ex["layers"]}
    return {h["layer"]: h["experts"] for h in m["shard"]["held"]}


def blob(d, m, layer, ie):
    """Expert (layer, ie)'s blob, located as docs/FORMAT.md says."""
    ex = m["experts"]
    lay = [l for l in ex["layers"] if l["layer"] == layer][0]
    held = held_sets(m).get(layer, [])
    rank = held.index(ie)
    with open(os.path.join(d, "experts.bin"), "rb") as f:
        f.seek(lay["offset"] + rank * ex["blob_bytes"])
        return f.read(ex["blob_bytes"])


def check_sharding(shoal, full, out, workers, replicas, tag):
    r = run([shoal, "shard", "--model", full, "--shards", str(workers), "--replicas",
             str(replicas), "--out", out])
    result("%s: shard exits 0" % tag, r.returncode == 0, r.stderr.strip())
    if r.returncode != 0:
        return
    result("%s: summary per worker" % tag,
           all(("worker-%d" % i) in r.stdout for i in range(workers)) and "GB" in r.stdout,
           r.stdout)
    fm = manifest(full)
    all_experts = {(l["layer"], ie) for l in fm["experts"]["layers"]
                   for ie in range(fm["experts"]["n_expert"])}
    count = {}
    shard_ok = True
    bytes_ok = True
    detail = ""
    dirs = [os.path.join(out, "worker-%d" % i) for i in range(workers)]
    for i, d in enumerate(dirs):
        m = manifest(d)
        sh = m.get("shard", {})
        if (sh.get("index"), sh.get("count"), sh.get("replicas"), sh.get("dense")) != \
                (i, workers, replicas, False):
            shard_ok = False
            detail = "worker-%d shard object %s" % (i, sh)
        if m["fingerprint"] != fm["fingerprint"] or m["experts"]["layers"][0]["xxh64"] != \
                fm["experts"]["layers"][0]["xxh64"] or m["config"] != fm["config"] or \
                m["dense"]["tensors"] != fm["dense"]["tensors"]:
            shard_ok = False
            detail = "worker-%d manifest differs from the full one" % i
        if os.path.exists(os.path.join(d, "dense.bin")):
            shard_ok = False
            detail = "worker-%d has dense.bin without --with-dense" % i
        n_held = 0
        for layer, ids in held_sets(m).items():
            if ids != sorted(set(ids)):
                shard_ok = False
                detail = "worker-%d layer %d ids not ascending" % (i, layer)
            for ie in ids:
                count[(layer, ie)] = count.get((layer, ie), 0) + 1
                n_held += 1
                if blob(d, m, layer, ie) != blob(full, fm, layer, ie):
                    bytes_ok = False
                    detail = "worker-%d layer %d expert %d bytes differ" % (i, layer, ie)
        size = os.path.getsize(os.path.join(d, "experts.bin"))
        if size != HEADER + n_held * fm["experts"]["blob_bytes"] or \
                m["experts"]["bytes"] != size:
            shard_ok = False
            detail = "worker-%d experts.bin is %d bytes for %d blobs" % (i, size, n_held)
        v = run([shoal, "inspect", d, "--verify"])
        result("%s: inspect --verify worker-%d" % (tag, i),
               v.returncode == 0 and "verify       ok" in v.stdout and
               ("fingerprint  " + fm["fingerprint"]) in v.stdout and
               ("holds        %d of %d experts" % (n_held, len(all_experts))) in v.stdout,
               v.stdout + v.stderr)
    result("%s: shard manifests keep the full model's fingerprint and checksums" % tag,
           shard_ok, detail)
    result("%s: held blobs equal the full container's bytes" % tag, bytes_ok, detail)
    result("%s: every expert on exactly %d shards, union covers all %d" %
           (tag, replicas, len(all_experts)),
           set(count) == all_experts and all(c == replicas for c in count.values()),
           "%d covered, counts %s" % (len(count), sorted(set(count.values()))))
    with open(os.path.join(out, "placement.json")) as f:
        pl = json.load(f)
    agree = pl["fingerprint"] == fm["fingerprint"] and pl["workers"] == workers and \
        pl["replicas"] == replicas and len(pl["shards"]) == workers
    for s in pl["shards"]:
        m = manifest(os.path.join(out, s["dir"]))
        agree &= s["experts"] == sum(len(v) for v in held_sets(m).values())
    for lay in pl["experts"]:
        for ie, holders in enumerate(lay["holders"]):
            agree &= len(holders) == replicas and len(set(holders)) == replicas
            for w in holders:
                m = manifest(os.path.join(out, "worker-%d" % w))
                agree &= ie in held_sets(m).get(lay["layer"], [])
    result("%s: placement.json agrees with the shards" % tag, agree)


def one_line_exit2(r):
    return r.returncode == 2 and r.stderr.strip() != "" and "\n" not in r.stderr.strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    a = ap.parse_args()
    shoal = os.path.abspath(a.shoal)
    tmp = tempfile.mkdtemp(prefix="shoal-shard-")
    try:
        full = os.path.join(tmp, "full")
        r = run([shoal, "convert", MODEL, full])
        result("convert the bundled model", r.returncode == 0, r.stderr.strip())
        if r.returncode != 0:
            return 1
        check_sharding(shoal, full, os.path.join(tmp, "r2"), 3, 2, "3 workers x 2 replicas")
        check_sharding(shoal, full, os.path.join(tmp, "r1"), 3, 1, "3 workers x 1 replica")

        # weights: 512 experts so that shares are meaningful
        syn = os.path.join(tmp, "syn")
        r = run([shoal, "synth", syn, "--gb", "0.01", "--family", "qwen3_moe", "--layers", "4",
                 "--n-expert", "128", "--hidden", "64", "--moe-ff", "32", "--heads", "2",
                 "--kv-heads", "1", "--head-dim", "32", "--vocab", "256", "--trace", "uniform"])
        result("synth a 4 x 128-expert container", r.returncode == 0, r.stderr.strip())
        if r.returncode == 0:
            out = os.path.join(tmp, "w311")
            r = run([shoal, "shard", "--model", syn, "--shards", "3", "--weights", "3,1,1",
                     "--out", out])
            result("weights 3,1,1: shard exits 0", r.returncode == 0, r.stderr.strip())
            if r.returncode == 0:
                n = [sum(len(v) for v in held_sets(manifest(os.path.join(out, "worker-%d" % i)))
                         .values()) for i in range(3)]
                share = [x / 512.0 for x in n]
                result("weights 3,1,1: worker 0 holds about 3/5 of the experts",
                       sum(n) == 512 and 0.5 <= share[0] <= 0.7 and
                       all(0.12 <= s <= 0.28 for s in share[1:]), "counts %s" % n)
                r = run([shoal, "inspect", os.path.join(out, "worker-0"), "--verify"])
                result("weights 3,1,1: worker-0 verifies", r.returncode == 0,
                       r.stdout + r.stderr)

        # --with-dense, and a coordinator on a shard without dense tensors
        out = os.path.join(tmp, "dense")
        r = run([shoal, "shard", "--model", full, "--shards", "2", "--with-dense", "--out", out])
        ok = r.returncode == 0
        if ok:
            with open(os.path.join(full, "dense.bin"), "rb") as f1, \
                    open(os.path.join(out, "worker-1", "dense.bin"), "rb") as f2:
                ok = f1.read() == f2.read()
            ok &= manifest(os.path.join(out, "worker-1"))["shard"]["dense"] is True
        result("--with-dense copies dense.bin byte for byte", ok, r.stderr.strip())
        r = run([shoal, "run", "--model", os.path.join(tmp, "r1", "worker-0"), "--tokens",
                 "1,2,3", "--max-tokens", "1"])
        result("run on a shard without dense.bin is refused, naming the full container",
               r.returncode != 0 and "is a shard without dense tensors" in r.stderr and
               "run the coordinator on the full container" in r.stderr, r.stderr.strip())

        # existing outputs need --force
        out = os.path.join(tmp, "r1")
        r = run([shoal, "shard", "--model", full, "--shards", "3", "--out", out])
        result("existing shards are refused without --force",
               one_line_exit2(r) and "--force" in r.stderr, r.stderr.strip())
        r = run([shoal, "shard", "--model", full, "--shards", "3", "--out", out, "--force"])
        result("--force replaces them", r.returncode == 0, r.stderr.strip())
        r = run([shoal, "shard", "--model", os.path.join(out, "worker-0"), "--shards", "2",
                 "--out", os.path.join(tmp, "sos")])
        result("a shard cannot be sharded again", r.returncode == 2 and
               "shard the full container" in r.stderr, r.stderr.strip())

        # a damaged source blob: error names it; no temporary directory is left
        bad = os.path.join(tmp, "bad")
        shutil.copytree(full, bad)
        m = manifest(bad)
        lay = m["experts"]["layers"][1]
        off = lay["offset"] + 5 * m["experts"]["blob_bytes"] + 17
        with open(os.path.join(bad, "experts.bin"), "r+b") as f:
            f.seek(off)
            c = f.read(1)
            f.seek(off)
            f.write(bytes([c[0] ^ 0xFF]))
        out = os.path.join(tmp, "badout")
        r = run([shoal, "shard", "--model", bad, "--shards", "2", "--replicas", "2",
                 "--out", out])
        left = [x for x in os.listdir(out) if ".tmp-" in x] if os.path.isdir(out) else []
        result("a damaged source blob is named and leaves no temporary directory",
               r.returncode == 1 and "layer %d expert 5" % lay["layer"] in r.stderr and
               "checksum mismatch" in r.stderr and not left, r.stderr.strip() + " left=%s" % left)

        # bad inputs: exit 2, one line, nothing written
        bad_out = os.path.join(tmp, "never")
        cases = [
            ("--shards 0", ["--model", full, "--shards", "0", "--out", bad_out]),
            ("--replicas 0", ["--model", full, "--shards", "3", "--replicas", "0",
                              "--out", bad_out]),
            ("--replicas > --shards", ["--model", full, "--shards", "3", "--replicas", "4",
                                        "--out", bad_out]),
            ("2 weights for 3 shards", ["--model", full, "--shards", "3", "--weights", "1,2",
                                         "--out", bad_out]),
            ("a zero weight", ["--model", full, "--shards", "3", "--weights", "1,0,1",
                               "--out", bad_out]),
            ("a negative weight", ["--model", full, "--shards", "2", "--weights", "1,-2",
                                   "--out", bad_out]),
            ("a weight that is not a number", ["--model", full, "--shards", "2",
                                               "--weights", "1,abc", "--out", bad_out]),
            ("--out missing", ["--model", full, "--shards", "2"]),
            ("--shards missing", ["--model", full, "--out", bad_out]),
            ("a Hugging Face directory", ["--model", MODEL, "--shards", "2", "--out", bad_out]),
        ]
        for name, args in cases:
            r = run([shoal, "shard"] + args)
            ok = one_line_exit2(r) and not os.path.exists(bad_out)
            if name == "a Hugging Face directory":
                ok &= "shoal convert" in r.stderr
            result("bad input exits 2 with one line: " + name, ok,
                   "rc=%d %r" % (r.returncode, r.stderr))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return result.summary()


if __name__ == "__main__":
    sys.exit(main())
