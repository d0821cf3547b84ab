#!/usr/bin/python3
"""A GGUF file's routed experts streamed through the expert store (issue 30):
each expert's three ranges are read from the file itself, in whole pages
around them (GGUF offsets are 32-byte aligned), with the cache, pins,
prefetch, O_DIRECT and --stats that containers have.

usage: /usr/bin/python3 tests/cli/test_gguf_stream.py --shoal build-test/coordinator/shoal

The file is the bundled checkpoint written as a BF16 GGUF by
tests/cli/test_run_gguf.py's writer, so the reference is the checkpoint's
own run (the same weights through the same engine).

Cases:
  store:  the logits of 16 greedy steps are the checkpoint's bytes with the
          store at its defaults, with O_DIRECT (io_uring and the pread
          pool), with a cache of 1 MB (about three experts: every step reads
          again, the last expert of the file included, whose page-rounded
          read runs past the end of the file), with pinned experts, and with
          prefetch off at queue depth 1
  stats:  --stats names the GGUF file as the source; with the small cache
          the store reads more bytes than the experts hold (evicted experts
          are read again) and its peak expert memory stays within the cache,
          the staging area and the pins
  split:  a set of two files (layers 0-1 in the first, 2-3 in the second)
          gives the same bytes, from either file's name
  counts: routing counts go to $XDG_CACHE_HOME/shoal under the layout's
          fingerprint, never next to the GGUF (its directory may hold other
          models)
  cluster: two shoal-workers serving halves of the same file (--shard 0/2
          and 1/2) to a coordinator without local experts, then one worker
          beside the coordinator's own store: the checkpoint's logits bytes,
          both workers used; a renamed copy is served, a file of the same
          name with one expert tensor negated is refused by fingerprint
  docs:   docs/OPERATIONS.md "Running a GGUF file": its file (tests/make_gguf.py
          --type Q8_0) gives the lines the section shows for inspect, plan
          and a run with a 1 MB cache
  shrink: the file truncated under a running perplexity (its trunk mapping
          faults): one line saying so, exit 1
  worker: a worker on a file that is no GGUF exits 2; a NaN Q8_0 scale in
          a worker's copy of the file (in expert 1 of layer 0, a page the
          fingerprint does not sample): its log line names the file,
          tensor, layer and expert, as the coordinator's error reply does
  bad:    --mirror on a GGUF: one line saying why, exit 2
Ends with "N passed, M failed"; exit status 1 if anything failed.
"""

import argparse
import glob
import os
import re
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import harness as H  # noqa: E402
import test_run_gguf as W  # noqa: E402  (the writer and the checkpoint's tensors)

result = H.Results()
ARGS = ["--tokens", "1,2,3", "--max-tokens", "16", "--greedy"]


def run(shoal, model, out, *extra, env=None):
    r = H.run([shoal, "run", model] + ARGS + ["--logits-out", out] + list(extra),
              timeout=120, env=env)
    return r, (np.load(out) if r.returncode == 0 and os.path.exists(out) else None)


def same(a, b):
    return a is not None and b is not None and a.shape == b.shape and a.tobytes() == b.tobytes()


def stats_of(stderr):
    """(bytes read in MB, peak MB, cache MB) from --stats' lines."""
    read = re.search(r"experts: io \w+, queue depth \d+: ([\d.]+) MB read", stderr)
    peak = re.search(r"peak ([\d.]+) MB", stderr)
    return (float(read.group(1)) if read else -1.0, float(peak.group(1)) if peak else -1.0)


def u16(key, val):
    return W.s_(key) + struct.pack("<IH", 2, val)


def test_cluster(shoal, tmp, path, ref, env, kvs, tensors):
    worker_bin = os.path.join(os.path.dirname(os.path.dirname(shoal)), "worker", "shoal-worker")
    ws = [H.Worker(worker_bin, tmp, "w%d" % i, path, "--shard", "%d/2" % i) for i in range(2)]
    try:
        addrs = [w.wait_ready() for w in ws]
        if not result("two shoal-workers serve the GGUF (--shard 0/2, 1/2)", all(addrs),
                      " | ".join(w.text()[-300:] for w in ws)):
            return
        r, got = run(shoal, path, os.path.join(tmp, "c2.npy"), "--workers", ",".join(addrs),
                     "--local-experts", "off", "--control", "off", "--stats", env=env)
        used = re.findall(r"executor \d+ \S+: up, \d+ experts, (\d+) requests", r.stderr)
        result("cluster of 2 workers on the GGUF, no local experts: the checkpoint's logits "
               "bytes, both workers used (%s requests)" % used,
               r.returncode == 0 and same(got, ref) and len(used) == 2 and
               all(int(u) > 0 for u in used), W.show(r))
        r, got = run(shoal, path, os.path.join(tmp, "c1.npy"), "--workers", addrs[0],
                     "--control", "off", "--direct", "on", "--expert-cache", "1MB", env=env)
        result("cluster of the local store and 1 worker: the checkpoint's logits bytes",
               r.returncode == 0 and same(got, ref), W.show(r))
        # the fingerprint is the experts', not the file's name: a renamed
        # copy serves; the same name with other expert bytes is refused
        renamed = os.path.join(tmp, "renamed.gguf")
        os.symlink(path, renamed)
        r, got = run(shoal, renamed, os.path.join(tmp, "c3.npy"), "--workers", ",".join(addrs),
                     "--local-experts", "off", "--control", "off", env=env)
        result("a renamed copy of the file: the workers serve it, the same bytes",
               r.returncode == 0 and same(got, ref), W.show(r))
        other = os.path.join(tmp, "other", os.path.basename(path))
        os.makedirs(os.path.dirname(other))
        W.write_gguf(other, kvs, [(n, -x if n == "blk.2.ffn_up_exps.weight" else x, t)
                                  for n, x, t in tensors])
        r, _ = run(shoal, other, os.path.join(tmp, "c4.npy"), "--workers", ",".join(addrs),
                   "--local-experts", "off", "--control", "off", env=env)
        result("the same name with other experts (one tensor negated): refused by fingerprint, "
               "exit 1", r.returncode == 1 and "fingerprint mismatch" in r.stderr, W.show(r))
    finally:
        for w in ws:
            w.stop()


def test_worker_bad_file(shoal, tmp, tensors, kvs, env):
    """A worker's copy of the file with a NaN Q8_0 scale in expert 1 of
    layer 0 (outside the first, middle and last pages the fingerprint
    samples): its log names the file, tensor and expert, as the error reply
    does (not 'malformed input'); a file that is no GGUF: exit 2."""
    worker_bin = os.path.join(os.path.dirname(os.path.dirname(shoal)), "worker", "shoal-worker")
    bad = os.path.join(tmp, "not.gguf")
    with open(bad, "wb") as f:
        f.write(b"GGUF\x03\x00\x00\x00junk")
    r = H.run([worker_bin, "--model", bad, "--listen", "127.0.0.1:0"], timeout=30)
    lines = (r.stderr or "").strip().splitlines()
    result("shoal-worker on a file that is no GGUF: exit 2 (as shoal run), one line",
           r.returncode == 2 and len(lines) == 1 and bad in lines[0], W.show(r))
    t = [(n, x, "Q8_0" if "_exps." in n else typ) for n, x, typ in tensors]
    paths = [os.path.join(tmp, d, "q8.gguf") for d in ("good", "nan")]
    down_blocks = 256 * 6      # an expert's down: 256 rows of six Q8_0 blocks
    nan = {"blk.0.ffn_down_exps.weight": (down_blocks * 34, 0x7E00)}   # expert 1, block 0
    for p, poison in zip(paths, (None, nan)):
        os.makedirs(os.path.dirname(p))
        W.write_gguf(p, kvs, t, poison=poison)
    w = H.Worker(worker_bin, tmp, "w-nan", paths[1])
    try:
        addr = w.wait_ready()
        r, _ = run(shoal, paths[0], os.path.join(tmp, "nan.npy"), "--workers", str(addr),
                   "--local-experts", "off", "--control", "off", env=env)
        failed = [l for l in w.text().splitlines() if "failed: " in l]
        result("a NaN scale in the worker's copy: its log names file, tensor, layer, expert",
               r.returncode == 1 and failed and all(n in failed[0] for n in (
                   paths[1], "blk.0.ffn_down_exps.weight", "d = nan", "(layer 0)",
                   "expert 1")), "%s | %s" % (W.show(r), failed or w.text()[-300:]))
    finally:
        w.stop()


def test_doc_example(shoal, tmp, env):
    doc = open(os.path.join(H.ROOT, "docs", "OPERATIONS.md")).read()
    sec = doc.split("## Running a GGUF file", 1)[-1].split("\n## ", 1)[0]
    path = os.path.join(tmp, "shakespeare-q8_0.gguf")
    r = H.run([sys.executable, os.path.join(H.ROOT, "tests", "make_gguf.py"), path, "--type",
               "Q8_0"])
    if not result("tests/make_gguf.py writes the section's file", r.returncode == 0, r.stderr):
        return
    want = [l for l in sec.splitlines() if l.startswith(("routed experts", "Q8_0  ", "shoal run takes",
                                                          "experts      ", "run with     ",
                                                          "tensors      "))]
    got = H.run([shoal, "inspect", path]).stdout + H.run([shoal, "plan", path, "--ram", "8G"],
                                                         env=env).stdout
    got = got.replace(path, "/tmp/shakespeare-q8_0.gguf")
    # the kernel table inspect names is this CPU's; the section shows an AVX2 machine's
    got = re.sub(r"runs \((?!scalar)\S+ kernels\)", "runs (avx2 kernels)", got)
    missing = [l for l in want if l not in got.splitlines()]
    result("OPERATIONS.md's inspect and plan lines (%d) are what the file gives" % len(want),
           len(want) == 6 and not missing, "missing %s" % missing)
    r = H.run([shoal, "run", path, "--prompt", "ROMEO:", "--max-tokens", "24", "--greedy",
               "--expert-cache", "1M", "--direct", "on"], env=env, timeout=120)
    text = re.search(r"--expert-cache 1M --direct on --stats\n(.*?)\n\.\.\.", sec, re.S)
    result("OPERATIONS.md's run with a 1 MB cache prints its text",
           r.returncode == 0 and text is not None and r.stdout.startswith(text.group(1)),
           "%r vs %r" % (r.stdout[:80], text and text.group(1)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    a = ap.parse_args()
    shoal = os.path.abspath(a.shoal)
    cfg, _, tensors = W.checkpoint()
    tensors = W.typed(tensors, "BF16")
    kvs = W.metadata(cfg)
    exp_mb = sum(x.size * 2 for n, x, t in tensors if "_exps." in n) / 1e6
    with tempfile.TemporaryDirectory(prefix="shoal-gguf-stream-") as tmp:
        env = dict(os.environ, XDG_CACHE_HOME=os.path.join(tmp, "cache"))
        r, ref = run(shoal, W.MODEL, os.path.join(tmp, "ref.npy"), env=env)
        if not result("the checkpoint's own run", r.returncode == 0 and ref is not None,
                      W.show(r)):
            sys.exit(result.summary())
        gdir = os.path.join(tmp, "models")
        os.makedirs(gdir)
        path = os.path.join(gdir, "shakespeare-bf16.gguf")
        W.write_gguf(path, kvs, tensors)

        # store: every configuration gives the checkpoint's bytes
        configs = [("defaults", []),
                   ("O_DIRECT, io_uring", ["--direct", "on", "--io", "uring"]),
                   ("O_DIRECT, pread pool", ["--direct", "on", "--io", "pread"]),
                   ("a 1 MB cache, O_DIRECT", ["--expert-cache", "1MB", "--direct", "on"]),
                   ("2 MB pinned, a 1 MB cache", ["--pin", "2MB", "--expert-cache", "1MB"]),
                   ("prefetch off, queue depth 1", ["--prefetch", "off", "--queue-depth", "1",
                                                    "--expert-cache", "1MB"])]
        small = None
        for i, (label, extra) in enumerate(configs):
            r, got = run(shoal, path, os.path.join(tmp, "s%d.npy" % i), "--stats", *extra,
                         env=env)
            result("store, %s: the checkpoint's logits bytes" % label,
                   r.returncode == 0 and same(got, ref), W.show(r))
            if label.startswith("a 1 MB cache"):
                small = r

        # stats
        r, _ = run(shoal, path, os.path.join(tmp, "st.npy"), "--stats", env=env)
        result("--stats names the GGUF file as the store's source",
               r.returncode == 0 and re.search(r"source 0 \S*/shakespeare-bf16\.gguf: ",
                                               r.stderr) is not None,
               r.stderr[-600:])
        if small is not None:
            read, peak = stats_of(small.stderr)
            # 1 MB cache + 8 staging buffers of the largest expert (3 pages of slack each)
            blob = max(x.size * 2 for n, x, t in tensors if "_exps." in n) / cfg["num_experts"]
            bound = 1.0 + 8 * (3 * blob + 3 * 8192) / 1e6
            result("a 1 MB cache reads evicted experts again: %.1f MB read > the %.1f MB the "
                   "experts hold; peak %.2f MB <= %.2f MB" % (read, exp_mb, peak, bound),
                   read > exp_mb and 0 < peak <= bound, small.stderr[-800:])

        # split: layers 0-1 in file 1, the rest in file 2
        first = [t for t in tensors if not t[0].startswith("blk.") or
                 int(t[0].split(".")[1]) < 2]
        second = [t for t in tensors if t not in first]
        sdir = os.path.join(tmp, "split")
        os.makedirs(sdir)
        for i, part in enumerate((first, second)):
            extra = [u16("split.no", i), u16("split.count", 2)]
            if i == 0:
                extra.append(W.kv("split.tensors.count", "i32", len(tensors)))
            W.write_gguf(os.path.join(sdir, "m-%05d-of-00002.gguf" % (i + 1)),
                         (kvs if i == 0 else []) + extra, part)
        for i in (1, 2):
            r, got = run(shoal, os.path.join(sdir, "m-%05d-of-00002.gguf" % i),
                         os.path.join(tmp, "split%d.npy" % i), "--direct", "on",
                         "--expert-cache", "1MB", env=env)
            result("a split set from file %d of 2: the checkpoint's logits bytes" % i,
                   r.returncode == 0 and same(got, ref), W.show(r))

        # counts
        counts = glob.glob(os.path.join(tmp, "cache", "shoal", "routing_counts-*.json"))
        result("routing counts in $XDG_CACHE_HOME/shoal, none next to the GGUF",
               len(counts) >= 1 and not os.path.exists(os.path.join(gdir, "routing_counts.json")),
               "%s; %s" % (counts, os.listdir(gdir)))

        test_cluster(shoal, tmp, path, ref, env, kvs, tensors)
        test_doc_example(shoal, tmp, env)
        test_worker_bad_file(shoal, tmp, tensors, kvs, env)

        # a file truncated under a running process: its mapping faults
        live = os.path.join(tmp, "live.gguf")
        W.write_gguf(live, kvs + W.vocab_kvs(), tensors)   # a vocabulary: perplexity reads text
        text = os.path.join(tmp, "text.txt")
        with open(text, "w") as f:
            f.write(open(os.path.join(W.MODEL, "MODEL_CARD.md")).read() * 40)
        p = subprocess.Popen([shoal, "perplexity", live, "--file", text, "--ctx", "64",
                              "--threads", "1"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
        time.sleep(1.0)
        os.truncate(live, 1 << 20)   # inside token_embd
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        lines = [l for l in err.splitlines() if l.strip()]
        result("a GGUF truncated while it runs: one line saying so, exit 1 (not a SIGBUS death)",
               p.returncode == 1 and len(lines) == 1 and "shrank" in lines[0],
               "exit %s: %s" % (p.returncode, err[-300:]))

        # bad
        r, _ = run(shoal, path, os.path.join(tmp, "bad.npy"), "--mirror", tmp, env=env)
        lines = [l for l in r.stderr.splitlines() if l.strip()]
        result("--mirror on a GGUF: one line naming --mirror and GGUF, exit 2",
               r.returncode == 2 and len(lines) == 1 and "--mirror" in lines[0] and
               "GGUF" in lines[0], W.show(r))
    sys.exit(result.summary())


if __name__ == "__main__":
    main()
