#!/usr/bin/env python3
"""Draining (issue 5, `shoal status` state "draining"): SIGTERM makes a
shoal-worker finish what it has, tell each coordinator it is draining,
answer new requests with an error so they move, and exit 0; a second signal
exits at once.

Real processes on loopback: two workers holding the whole bundled model,
a coordinator with --local-experts off. The coordinator is paused
(SIGSTOP) while one worker gets SIGTERM, so the drain lands mid-decode.
Checks: the worker exits 0 within its drain deadline and logs the drain;
the coordinator logs that the worker is draining, keeps going on the
other worker, and its logits bytes and tokens equal an in-process run.

Usage: /usr/bin/python3 tests/cluster/test_drain.py --shoal BIN --worker BIN
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clusterlib import MODEL, free_port  # noqa: E402
import harness as H  # noqa: E402  (tests/, on the path through clusterlib)


result = H.Results()


def wait_log(path, text, proc, timeout=30):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if os.path.exists(path) and text in open(path, errors="replace").read():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--worker", required=True)
    a = ap.parse_args()
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    tmp = tempfile.mkdtemp(prefix="shoal-drain-")
    procs = []
    try:
        ct = os.path.join(tmp, "c")
        subprocess.run([a.shoal, "convert", MODEL, ct], check=True, capture_output=True)
        gen = ["--model", ct, "--prompt", "ROMEO:\n", "--max-tokens", "200", "--seed", "3",
               "--ignore-eos", "--no-echo"]
        ref_npy = os.path.join(tmp, "ref.npy")
        ref = subprocess.run([a.shoal, "run"] + gen + ["--logits-out", ref_npy],
                             capture_output=True, env=env)
        result("in-process reference run", ref.returncode == 0, ref.stderr[-300:])

        ports = [free_port(), free_port()]
        logs = [os.path.join(tmp, "w%d.log" % i) for i in range(2)]
        ws = []
        for port, log in zip(ports, logs):
            p = subprocess.Popen([a.worker, "--model", ct, "--listen", "127.0.0.1:%d" % port,
                                  "--threads", "1"], stdout=open(log, "w"),
                                 stderr=subprocess.STDOUT, env=env)
            procs.append(p)
            ws.append(p)
        for p, log in zip(ws, logs):
            result("worker serving", wait_log(log, "serving", p))

        out_npy = os.path.join(tmp, "out.npy")
        coord_err = os.path.join(tmp, "coord.err")
        c = subprocess.Popen([a.shoal, "run"] + gen +
                             ["--workers", ",".join("127.0.0.1:%d" % p for p in ports),
                              "--local-experts", "off", "--control", "off", "-v",
                              "--logits-out", out_npy],
                             stdout=subprocess.PIPE, stderr=open(coord_err, "w"), env=env)
        procs.append(c)
        first = c.stdout.read(1)       # decoding has started
        c.send_signal(signal.SIGSTOP)
        t0 = time.time()
        ws[1].send_signal(signal.SIGTERM)
        try:
            rc = ws[1].wait(timeout=15)
        except subprocess.TimeoutExpired:
            rc = None
        took = time.time() - t0
        c.send_signal(signal.SIGCONT)
        log1 = open(logs[1], errors="replace").read()
        result("SIGTERM: the worker drains and exits 0 within its deadline",
               rc == 0 and took < 12, "rc=%s after %.1f s" % (rc, took))
        result("the worker logs the drain", "draining" in log1 and "drained" in log1,
               log1.strip().splitlines()[-1] if log1.strip() else "")
        rest = c.stdout.read()
        crc = c.wait(timeout=120)
        err = open(coord_err, errors="replace").read()
        result("the coordinator finishes on the other worker", crc == 0, err[-400:])
        result("the coordinator logs that the worker is draining",
               "is draining" in err and "127.0.0.1:%d" % ports[1] in err,
               [l for l in err.splitlines() if "drain" in l][:2])
        same = (os.path.exists(out_npy) and
                open(out_npy, "rb").read() == open(ref_npy, "rb").read())
        result("logits bytes identical to the in-process run", same)
        result("generated text identical", len(ref.stdout) > 100 and first + rest == ref.stdout,
               "%d vs %d bytes" % (len(first + rest), len(ref.stdout)))

        # a second signal exits at once, even with a coordinator attached
        port = free_port()
        log = os.path.join(tmp, "w2.log")
        p = subprocess.Popen([a.worker, "--model", ct, "--listen", "127.0.0.1:%d" % port],
                             stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
        procs.append(p)
        wait_log(log, "serving", p)
        p.send_signal(signal.SIGTERM)
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            rc = None
        result("an idle worker exits 0 on SIGTERM", rc == 0, "rc=%s" % rc)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return result.summary()


if __name__ == "__main__":
    sys.exit(main())
