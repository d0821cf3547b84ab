#!/usr/bin/env python3
"""No straggler (issue 33): hot replicas and row splitting, with real
processes on loopback and the bundled model (converted, INT4A8 experts: the
int8-activation GEMM for rows > 1, the matvec for one row).

1. --hot-replicas: 3 workers with --shard I/3 --hot-replicas 2 and the same
   --routing file (the in-process run's routing_counts.json) hold 32 + 8
   experts between them (4 MoE layers x 8 experts, the 2 hottest of each
   layer on one more worker), the same sets `shoal shard --hot-replicas 2`
   writes; a bad value is a one-line usage error, exit 2;
2. decode (--local-experts off): token ids, text and logits bytes identical
   to the in-process run; nothing split (one row per expert);
3. a long prompt with --split-rows always, auto and off: identical bits;
   --stats says experts were split among their holders with always (a run
   where splitting never happens fails here) and none with off;
4. a `shoal chat` on 3 workers --shard I/3:2 --hot-replicas 2: a holder of
   hot experts is stopped (SIGSTOP) as the long prompt goes out and killed
   (kill -9) while its requests are pending (--split-rows always: pieces
   of split experts among them): they are re-run on the other holders
   within the layer step, the reply is the in-process one;
5. a worker whose outputs hold a NaN (SHOAL_TEST_NAN_EXPERT, test_faulty.py)
   beside an honest one, --split-rows always: its pieces are recomputed by
   the honest one, the bits are the in-process ones, it is marked faulty.

Usage: /usr/bin/python3 tests/cluster/test_hot.py --shoal BIN --worker BIN
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import clusterlib as L  # noqa: E402

R = L.Results()
LONG = ("ROMEO:\nBut soft, what light through yonder window breaks? It is the east, "
        "and Juliet is the sun.\n") * 7
SHORT = "ROMEO:\nBut soft, what light through yonder window breaks?\nJULIET:\n"
DECODE = ["--max-tokens", "24", "--seed", "7", "--temp", "0.8", "--ignore-eos"]
PREFILL = ["--max-tokens", "8", "--seed", "7", "--temp", "0.8", "--ignore-eos"]


def held(w):
    """'N of M experts' from a worker's serving line."""
    m = re.search(r"(\d+) of (\d+) experts", w.text())
    return int(m.group(1)) if m else None


def split_count(err):
    """(max/mean busy, experts split) from --stats' balance line."""
    m = re.search(r"cluster balance: busy max/mean per layer step ([\d.]+) \((\d+) steps\), "
                  r"(\d+) experts split \((\d+) rows\)", err)
    return (float(m.group(1)), int(m.group(3))) if m else (None, None)


def gen(a, tmp, name, prompt, g, ws, *flags):
    return L.Gen(a.shoal, tmp, name, a.ct, ["--prompt", prompt], g,
                 L.workers_flag(ws) + ["--local-experts", "off", "--control", "off",
                                       "--stats"] + list(flags))


def chat(a, tmp, name, stdin, flags=(), victim=None):
    """A `shoal chat` fed stdin; with victim: once the cluster is up, stop
    the victim, send the line, wait until the coordinator has sent it a
    request (its status row), kill it. Returns (rc, out, err)."""
    errp = os.path.join(tmp, name + ".err")
    errf = open(errp, "w+")
    cmd = [a.shoal, "chat", "--model", a.ct, "--max-tokens", "8", "--seed", "5",
           "--ignore-eos"] + list(flags)
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errf,
                         env=L.env())
    L.procs.append(p)
    if victim:
        addr = L.control_addr(errp, p=p)
        st, _ = L.poll(lambda: (lambda s: s if s and all(
            e["state"] == "up" for e in s["executors"]) else None)(
                L.status_json(a.shoal, addr)), 60) if addr else (None, 0)
        req0 = L.executor(st, victim.addr)["requests"] if st else 0
        os.kill(victim.p.pid, signal.SIGSTOP)
        p.stdin.write(stdin.encode())
        p.stdin.flush()
        # a request of the prompt's to the stopped victim is out
        L.poll(lambda: (lambda s: s and L.executor(s, victim.addr)["requests"] > req0)(
            L.status_json(a.shoal, addr)), 60)
        victim.p.kill()
        victim.p.wait()
        out, _ = p.communicate(timeout=180)
    else:
        out, _ = p.communicate(stdin.encode(), timeout=180)
    errf.seek(0)
    err = errf.read()
    errf.close()
    return p.returncode, out.decode("utf-8", "replace"), err


def three(a, tmp, name, flags):
    """3 started workers of a.ct, worker i with the flags flags(i)."""
    ws = []
    try:
        for i in range(3):
            ws.append(L.Worker(a.worker, tmp, "%s-%d" % (name, i), a.ct, *flags(i)))
            if not ws[-1].wait_ready():
                raise RuntimeError("worker %s-%d did not start: %s" %
                                   (name, i, ws[-1].text()[-600:]))
    except BaseException:
        L.stop_workers(ws)
        raise
    return ws


def sharded(a, tmp, name, replicas, routing):
    """3 started workers --shard I/3REPLICAS --hot-replicas 2 --routing FILE."""
    return three(a, tmp, name, lambda i: ["--shard", "%d/3%s" % (i, replicas),
                                          "--hot-replicas", "2", "--routing", routing])


def shard_counts(a, tmp, out, *flags):
    """`shoal shard a.ct --shards 3 FLAGS --out TMP/OUT`: (its result, the
    experts of each shard from placement.json)."""
    r = L.run([a.shoal, "shard", a.ct, "--shards", "3"] + list(flags) +
              ["--out", os.path.join(tmp, out)])
    with open(os.path.join(tmp, out, "placement.json")) as f:
        return r, [s["experts"] for s in json.load(f)["shards"]]


def usage_errors(a, flag, bads):
    """Each of bads as FLAG's value on shoal-worker --shard 0/3: one line, exit 2."""
    for bad in bads:
        r = L.run([a.worker, "--model", a.ct, "--shard", "0/3", flag, bad])
        lines = r.stderr.strip().splitlines()
        R("%s %s: one-line usage error, exit 2" % (flag, bad),
          r.returncode == 2 and len(lines) == 1 and flag in lines[0],
          "rc=%d %s" % (r.returncode, r.stderr[-300:]))


def poisoned(a, tmp, name, poison):
    """A started worker holding every expert, SHOAL_TEST_NAN_EXPERT=poison
    (a NaN in those experts' outputs: test_faulty.py) unless None."""
    def launch(cmd, **kw):
        kw["env"] = L.env()
        kw["env"].pop("SHOAL_TEST_NAN_EXPERT", None)
        if poison:
            kw["env"]["SHOAL_TEST_NAN_EXPERT"] = poison
        return subprocess.Popen(cmd, **kw)
    w = L.Worker(a.worker, tmp, name, a.ct, launch=launch)
    if not w.wait_ready():
        w.stop()
        raise RuntimeError("worker %s did not start: %s" % (name, w.text()[-600:]))
    return w


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--worker", required=True)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="shoal-hot-")
    a.ct = os.path.join(tmp, "ct")
    ws = []
    try:
        r = L.run([a.shoal, "convert", L.MODEL, a.ct, "--experts", "int4a8"])
        if not R("convert the bundled model (int4a8)", r.returncode == 0, r.stderr[-500:]):
            return R.summary()
        base_d = L.Gen(a.shoal, tmp, "base_d", a.ct, ["--prompt", SHORT], DECODE)
        base_p = L.Gen(a.shoal, tmp, "base_p", a.ct, ["--prompt", LONG], PREFILL)
        counts = os.path.join(a.ct, "routing_counts.json")
        if not R("in-process runs (they write routing_counts.json)",
                 base_d.rc == 0 and base_p.rc == 0 and os.path.exists(counts),
                 L.detail(base_d) + L.detail(base_p)):
            return R.summary()
        routing = os.path.join(tmp, "routing.json")
        shutil.copy(counts, routing)   # the counts every worker ranks by

        # 1. holdings
        ws = sharded(a, tmp, "hot", "", routing)
        n = [held(w) for w in ws]
        R("3 workers --shard I/3 --hot-replicas 2: 32 + 4 x 2 experts held in all",
          None not in n and sum(n) == 40, "held %s" % n)
        r, counts = shard_counts(a, tmp, "shards", "--hot-replicas", "2", "--routing", routing)
        R("shoal shard --hot-replicas 2 writes the shards the workers hold",
          r.returncode == 0 and counts == n, "%s vs %s %s" % (counts, n, r.stderr[-300:]))
        usage_errors(a, "--hot-replicas", ("0", "x", "2:0"))

        # 1b. weighted shares (--shard-weights: a faster disk holds more)
        wws = []
        try:
            wws = three(a, tmp, "wt", lambda i: ["--shard", "%d/3" % i,
                                                  "--shard-weights", "3,1,1"])
            nw = [held(w) for w in wws]
            r, counts = shard_counts(a, tmp, "wshards", "--weights", "3,1,1")
            R("--shard-weights 3,1,1: the workers hold what shoal shard --weights 3,1,1 "
              "writes, every expert once, the first more than either other",
              r.returncode == 0 and counts == nw and sum(nw) == 32 and nw[0] > max(nw[1], nw[2]),
              "held %s, shard wrote %s" % (nw, counts))
            g = gen(a, tmp, "weighted", SHORT, DECODE, wws)
            R("decode on weighted shares: ids, text and logits bytes = in-process",
              L.same(base_d, g), L.detail(g))
            # the wire against the f32 rows the placement needed, and one
            # layer round per MoE layer per forward pass (the prompt's, then
            # one per generated token but the last)
            wire = [float(x) for x in re.findall(r"wire ([\d.]+)x the rows it carried", g.err)]
            m = re.search(r"(\d+) layer rounds waited on workers", g.err)
            R("--stats: each worker's wire within 1.1x the rows it carried, 4 x 24 rounds",
              len(wire) == 3 and all(1.0 <= w <= 1.1 for w in wire) and m is not None and
              int(m.group(1)) == 4 * 24, "wire %s, rounds %s" % (wire, m and m.group(1)))
        finally:
            L.stop_workers(wws)
        usage_errors(a, "--shard-weights", ("3,1", "3,0,1", "3,x,1"))

        # 2. decode
        g = gen(a, tmp, "decode", SHORT, DECODE, ws)
        R("decode on hot replicas: ids, text and logits bytes = in-process",
          L.same(base_d, g), L.detail(g))
        ratio, splits = split_count(g.err)
        R("decode: --stats reports the balance, nothing split (one row per expert)",
          ratio is not None and ratio >= 1.0 and splits == 0, g.err[-600:])

        # 3. a long prompt: rows split among holders (always: whenever an
        # expert of 4+ rows has 2+ holders up; auto: where the estimate says
        # it pays, which on this tiny model may be nowhere), the same bits
        for mode in ("always", "auto", "off"):
            g = gen(a, tmp, "prefill_" + mode, LONG, PREFILL, ws, "--split-rows", mode)
            R("long prompt, --split-rows %s: ids, text and logits bytes = in-process" % mode,
              L.same(base_p, g), L.detail(g))
            ratio, splits = split_count(g.err)
            if mode != "auto":
                R("long prompt, --split-rows %s: --stats says %s" %
                  (mode, "experts were split among holders" if mode == "always" else
                   "nothing was split"),
                  splits is not None and (splits > 0) == (mode == "always"), g.err[-600:])
        for w in ws:
            R("worker %s still serving" % os.path.basename(w.log_path), w.alive())
        L.stop_workers(ws)
        ws = []

        # 4. a holder of hot experts dies mid-prompt
        ws = sharded(a, tmp, "kill", ":2", routing)
        rc0, out0, err0 = chat(a, tmp, "chat_base", LONG.replace("\n", " ") + "\n")
        victim = max(ws, key=held)
        rc1, out1, err1 = chat(a, tmp, "chat_kill", LONG.replace("\n", " ") + "\n",
                               L.workers_flag(ws) + ["--local-experts", "off", "--control",
                                                     "127.0.0.1:0", "--request-timeout",
                                                     "120", "--split-rows", "always", "--stats"],
                               victim=victim)
        R("kill -9 of a hot holder mid-prompt: the reply = in-process",
          rc0 == 0 and rc1 == 0 and out0 == out1 and len(out0) > 0,
          "rc %d/%d\n%r\n%r\n%s" % (rc0, rc1, out0[-200:], out1[-200:], err1[-600:]))
        # a failed request is counted (errors) only where the layer step
        # re-runs its experts on other holders
        m = re.search(r"executor \d+ %s: (\w+), \d+ experts, \d+ requests, (\d+) errors" %
                      re.escape(victim.addr), err1)
        R("kill -9 mid-prompt: its pending request failed and was re-run within the step "
          "(--stats: down, errors > 0), with split experts",
          m and m.group(1) == "down" and int(m.group(2)) > 0 and
          (split_count(err1)[1] or 0) > 0, err1[-900:])
        L.stop_workers(ws)
        ws = []

        # 5. a poisoned worker's pieces are recomputed by the other holder
        ws = [poisoned(a, tmp, "nan", "*:*"), poisoned(a, tmp, "honest", None)]
        g = gen(a, tmp, "nan", LONG, PREFILL, ws, "--split-rows", "always")
        fl = [x for x in g.err.splitlines() if " is faulty: " in x]
        R("a poisoned worker beside an honest one, rows split: the in-process bits, "
          "the poisoned one faulty", L.same(base_p, g) and len(fl) == 1 and
          ws[0].addr in fl[0] and (split_count(g.err)[1] or 0) > 0, L.detail(g))
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
