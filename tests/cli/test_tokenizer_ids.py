#!/usr/bin/python3
"""A tokenizer.json's memory is bounded by what the file holds, not by its largest id
(issue 28 item 10), on real `shoal tokenize` / `shoal detokenize` processes with their
peak RSS measured.

usage: /usr/bin/python3 tests/cli/test_tokenizer_ids.py --shoal build-test/coordinator/shoal
           [--timeout SECONDS] [--max-rss-mb MB]

The tokenizer tables were indexed by id, so one id near 2^24 in a 9-token file cost
~500 MB. Ids far past the file's token count are now kept in a sparse table. Cases:
  sparse ids:  an added token at 16777000, a vocab token at 5000000, and 1000 added
               tokens spread over 0..2^24, each in a small tokenizer.json: tokenize
               (--parse-special) gives those ids, detokenize gives their text back and
               nothing for an id in a hole, and peak RSS stays under --max-rss-mb
  real files:  the bundled tokenizer and ../shared/data's Mixtral and OLMoE
               tokenizer.json still tokenize (the tests that compare their ids with
               Hugging Face's are the unit tests); skipped when shared data is absent
Ends with "N passed, M failed"; exit status 1 if anything failed.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # tests/: harness
import harness as H  # noqa: E402
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
MODEL = os.path.join(ROOT, "models", "shakespeare-moe")
SHARED = H.shared("data", "tokenizers")
CRASH_MARKERS = ("Sanitizer", "Segmentation", "core dumped", "Aborted", "Traceback")



result = H.Results()


def run(cmd, timeout):
    """Runs cmd; returns (exit status, stdout, stderr, peak RSS in MB) of that process."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                p.kill()
                pid, status, ru = os.wait4(p.pid, 0)
                break
            time.sleep(0.02)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return (p.returncode, out.read().decode(errors="replace"),
                err.read().decode(errors="replace"), ru.ru_maxrss / 1024.0)


def tokenizer_dir(tmp, name, vocab, added):
    """A directory with a BPE tokenizer.json (no merges, no pre-tokenizer): vocab
    {text: id}, added [(content, id)] as non-special added tokens (shown when decoding)."""
    d = os.path.join(tmp, name)
    os.makedirs(d)
    t = {"version": "1.0", "model": {"type": "BPE", "vocab": vocab, "merges": []},
         "added_tokens": [{"id": i, "content": c, "special": False, "single_word": False,
                           "lstrip": False, "rstrip": False, "normalized": False}
                          for c, i in added]}
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(t, f)
    return d


def show(rc, out, err, rss):
    return "exit %s, peak RSS %.0f MB\nstdout: %s\nstderr: %s" % (rc, rss, out[-300:], err[-600:])


def check_tokenizer(shoal, d, label, text, want_ids, ids_in, want_text, timeout, max_rss):
    """tokenize text -> want_ids and detokenize ids_in -> want_text, each under max_rss."""
    rc, out, err, rss = run([shoal, "tokenize", "--model", d, "--no-bos", "--parse-special",
                             "--text", text], timeout)
    result("%s: tokenize %r -> %s" % (label, text, " ".join(map(str, want_ids))),
           rc == 0 and out.split() == [str(i) for i in want_ids], show(rc, out, err, rss))
    result("%s: tokenize's peak RSS %.0f MB < %d MB" % (label, rss, max_rss), rss < max_rss,
           show(rc, out, err, rss))
    rc, out, err, rss = run([shoal, "detokenize", "--model", d, "-n", "--ids",
                             ",".join(map(str, ids_in))], timeout)
    result("%s: detokenize %s -> %r" % (label, ",".join(map(str, ids_in)), want_text),
           rc == 0 and out == want_text, show(rc, out, err, rss))
    result("%s: detokenize's peak RSS %.0f MB < %d MB" % (label, rss, max_rss), rss < max_rss,
           show(rc, out, err, rss))


def test_sparse_ids(shoal, tmp, timeout, max_rss):
    vocab = {c: i for i, c in enumerate("abcdefgh")}
    d = tokenizer_dir(tmp, "added-big", vocab, [("<big>", 16777000)])
    check_tokenizer(shoal, d, "added token at id 16777000 in a 9-token file", "ab<big>c",
                    [0, 1, 16777000, 2], [0, 16777000, 8000000, 1], "a<big>b",
                    timeout, max_rss)
    d = tokenizer_dir(tmp, "vocab-big", dict(vocab, z=5000000), [])
    check_tokenizer(shoal, d, "vocab token at id 5000000 in a 9-token file", "abz",
                    [0, 1, 5000000], [5000000, 4999999, 7], "zh", timeout, max_rss)
    spread = [("<t%d>" % k, 9 + k * 16000) for k in range(1000)]   # up to 15984009
    d = tokenizer_dir(tmp, "spread", vocab, spread)
    check_tokenizer(shoal, d, "1000 added tokens spread up to id 15984009", "a<t500>b<t999>",
                    [0, 8000009, 1, 15984009], [8000009, 2, 15984009, 15984008], "<t500>c<t999>",
                    timeout, max_rss)


def test_real_files(shoal, tmp, timeout):
    files = [("bundled", os.path.join(MODEL, "tokenizer.json"))]
    for f in ("Mixtral-8x7B-v0.1.tokenizer.json", "OLMoE_gpt-neox-olmo-dolma-v1_5.tokenizer.json"):
        p = os.path.join(SHARED, f)
        if os.path.exists(p):
            files.append((f.split(".")[0], p))
        else:
            print("skip  %s (no %s)" % (f, p))
    for name, p in files:
        with open(p, encoding="utf-8") as f:
            t = json.load(f)
        ids = set(t["model"]["vocab"].values()) | {a["id"] for a in t.get("added_tokens", [])}
        d = os.path.join(tmp, "real-" + name)
        os.makedirs(d)
        shutil.copy(p, os.path.join(d, "tokenizer.json"))
        rc, out, err, rss = run([shoal, "tokenize", "--model", d, "--no-bos", "--text",
                                 "First Citizen: hear me speak."], timeout)
        got = out.split()
        result("%s tokenizer.json (%d ids, largest %d) still tokenizes" % (name, len(ids), max(ids)),
               rc == 0 and len(got) >= 4 and all(g.isdigit() and int(g) in ids for g in got),
               show(rc, out, err, rss))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--max-rss-mb", type=int, default=64,
                    help="peak RSS bound of the small files' processes (default 64)")
    a = ap.parse_args()
    shoal = os.path.abspath(a.shoal)
    with tempfile.TemporaryDirectory(prefix="shoal-tokids-") as tmp:
        test_sparse_ids(shoal, tmp, a.timeout, a.max_rss_mb)
        test_real_files(shoal, tmp, a.timeout)
    return result.summary()


if __name__ == "__main__":
    sys.exit(main())
