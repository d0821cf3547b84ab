#!/usr/bin/env python3
"""Non-finite expert outputs from a worker (issue 28, item 9).

A worker's answer that holds a NaN or an infinity is recomputed by another
holder before the coordinator trusts it: the same bits mean the value is
what the model computes (DESIGN contract 1: a NaN comes out the same
wherever it is computed) and it is kept; other bits mean the worker is
faulty: the recomputation is used and no more experts go to that worker.
With no other holder up, the answer is kept with a warning.

The faulty worker is a real shoal-worker with the test-only
SHOAL_TEST_NAN_EXPERT=LAYER:EXPERT ('*' for any), which puts a NaN no
kernel computes into those experts' outputs. Real processes over loopback,
`shoal run` of the bundled model (converted, int4 experts):

1. a poisoned worker beside the local store (both hold every expert):
   tokens, text and logits bytes equal the in-process run; one warning
   line names the worker faulty; --stats shows it "faulty";
2. a poisoned worker and an honest one, --local-experts off: the same
   bits as in-process, the poisoned one faulty, the honest one up;
3. only the poisoned worker holds the experts: its NaN is kept, with a
   warning saying it could not be checked (rate-limited), no worker marked
   faulty; the run ends on the NaN logits as any NaN would;
4. two workers poisoned alike (the same NaN from two holders: what a
   legitimate NaN looks like): accepted without a warning, nobody faulty,
   the same end as 3 (the NaN came out the same wherever it ran);
5. a bad SHOAL_TEST_NAN_EXPERT value: a one-line usage error, exit 2.

Usage: /usr/bin/python3 tests/cluster/test_faulty.py --shoal BIN --worker BIN
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import clusterlib as L  # noqa: E402

R = L.Results()
PROMPT = "ROMEO:\nBut soft, what light through yonder window breaks?\nJULIET:\n"
GEN = ["--max-tokens", "24", "--seed", "7", "--temp", "0.8", "--ignore-eos"]
POISON = "SHOAL_TEST_NAN_EXPERT"


def worker(a, tmp, name, poison=None):
    """A started worker holding every expert; poison: SHOAL_TEST_NAN_EXPERT."""
    def launch(cmd, **kw):
        e = L.env()
        e.pop(POISON, None)
        if poison:
            e[POISON] = poison
        kw["env"] = e
        return subprocess.Popen(cmd, **kw)
    w = L.Worker(a.worker, tmp, name, a.ct, launch=launch)
    if not w.wait_ready():
        raise RuntimeError("worker %s did not start: %s" % (name, w.text()[-600:]))
    return w


def gen(a, tmp, name, workers, *flags):
    return L.Gen(a.shoal, tmp, name, a.ct, ["--prompt", PROMPT], GEN,
                 ["--workers", ",".join(w.addr for w in workers), "--control", "off",
                  "--stats"] + list(flags))


def faulty_lines(g):
    return [l for l in g.err.splitlines() if " is faulty: " in l]


def unchecked_lines(g):
    return [l for l in g.err.splitlines() if "accepted unchecked" in l]


def requests_of(g, w):
    """The requests --stats says executor w got (None: no line)."""
    m = re.search(r"executor \d+ %s: \w+, \d+ experts, (\d+) requests" % re.escape(w.addr),
                  g.err)
    return int(m.group(1)) if m else None


def state_of(g, w):
    m = re.search(r"executor \d+ %s: (\w+)," % re.escape(w.addr), g.err)
    return m.group(1) if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--worker", required=True)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="shoal-faulty-")
    a.ct = os.path.join(tmp, "ct")
    ws = []
    try:
        r = L.run([a.shoal, "convert", L.MODEL, a.ct, "--experts", "int4"])
        if not R("convert the bundled model", r.returncode == 0, r.stderr[-500:]):
            return R.summary()
        base = L.Gen(a.shoal, tmp, "base", a.ct, ["--prompt", PROMPT], GEN)
        if not R("in-process run", base.rc == 0 and base.logits, L.detail(base)):
            return R.summary()

        bad = worker(a, tmp, "poisoned", "*:*")
        good = worker(a, tmp, "honest")
        bad2 = worker(a, tmp, "poisoned2", "*:*")
        ws = [bad, good, bad2]
        R("the poisoned worker says it is a test fault", "TEST ONLY" in bad.text(),
          bad.text()[-300:])

        # 1. beside the local store. Placement weighs each executor by its
        # measured disk and compute speed; on a loaded machine the worker's
        # start-up probes can come out so slow that the local store takes
        # every expert of a short run and the worker never answers. Then the
        # run proves nothing: run again (each run measures afresh).
        for attempt in range(6):
            g = gen(a, tmp, "local%d" % attempt, [bad])
            if requests_of(g, bad) != 0:
                break
        R("poisoned worker + local store: the worker got requests (attempt %d)" %
          (attempt + 1), requests_of(g, bad) != 0, g.err[-600:])
        R("poisoned worker + local store: tokens, text and logits bytes = in-process",
          L.same(base, g), L.detail(g))
        fl = faulty_lines(g)
        R("poisoned worker + local store: one warning line names the worker faulty",
          len(fl) == 1 and bad.addr in fl[0] and "local" in fl[0], "\n".join(fl) or g.err[-800:])
        R("poisoned worker + local store: --stats shows it faulty", state_of(g, bad) == "faulty",
          g.err[-600:])

        # 2. beside an honest worker
        g = gen(a, tmp, "honest", [bad, good], "--local-experts", "off")
        R("poisoned + honest worker: tokens, text and logits bytes = in-process",
          L.same(base, g), L.detail(g))
        fl = faulty_lines(g)
        R("poisoned + honest worker: the poisoned one is faulty, by the honest one's answer",
          len(fl) == 1 and bad.addr in fl[0] and good.addr in fl[0],
          "\n".join(fl) or g.err[-800:])
        R("poisoned + honest worker: --stats: faulty and up",
          state_of(g, bad) == "faulty" and state_of(g, good) == "up", g.err[-600:])

        # 3. no other holder
        alone = gen(a, tmp, "alone", [bad], "--local-experts", "off")
        ul = unchecked_lines(alone)
        R("poisoned worker alone: a warning says its NaN could not be checked",
          ul and bad.addr in ul[0], alone.err[-800:])
        R("poisoned worker alone: the warning is rate-limited (1, 2, 4, ...)",
          0 < len(ul) <= 12, "%d lines" % len(ul))
        R("poisoned worker alone: nobody is marked faulty",
          not faulty_lines(alone) and state_of(alone, bad) == "up", alone.err[-600:])
        R("poisoned worker alone: its NaN is kept (the run ends on NaN logits, exit 1)",
          alone.rc == 1 and "hold NaN" in alone.err, L.detail(alone))

        # 4. two holders computing the same NaN
        two = gen(a, tmp, "agree", [bad, bad2], "--local-experts", "off")
        R("two workers with the same NaN: accepted, nobody faulty, no warning",
          not faulty_lines(two) and not unchecked_lines(two) and
          state_of(two, bad) == "up" and state_of(two, bad2) == "up", two.err[-800:])
        nan_line = [l for l in two.err.splitlines() if "hold NaN" in l]
        R("two workers with the same NaN: the same end as one worker (same text, same NaN)",
          two.rc == alone.rc == 1 and two.out == alone.out and nan_line and
          nan_line[0] in alone.err, L.detail(two))

        # 5. a bad value
        for v in ("7", "x:1", "1:-2"):
            e = L.env()
            e[POISON] = v
            try:
                r = subprocess.run([a.worker, "--model", a.ct, "--listen", "127.0.0.1:0"],
                                   capture_output=True, text=True, timeout=60, env=e)
                rc, err = r.returncode, r.stderr
            except subprocess.TimeoutExpired:
                rc, err = None, "still running after 60 s (it started serving)"
            lines = err.strip().splitlines()
            R("%s=%s: one-line usage error, exit 2" % (POISON, v),
              rc == 2 and len(lines) == 1 and POISON in lines[0], "rc=%s %s" % (rc, err[-300:]))
        for w in ws:
            R("worker %s still serving" % os.path.basename(w.log_path), w.alive())
    finally:
        for w in ws:
            w.stop()
        L.kill_all()
        reports = [n for n in L.sanitizer_reports]
        R("no sanitizer report", not reports, " ".join(reports))
        shutil.rmtree(tmp, ignore_errors=True)
    return R.summary()


if __name__ == "__main__":
    sys.exit(main())
