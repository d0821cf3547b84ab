#!/usr/bin/env python3
"""shoal-worker against crafted frames (issue 5, test 4; DESIGN contract 3).

Converts the bundled model into a container (int4 experts), starts
shoal-worker on a free loopback port and drives it with wire_probe:
- malformed, truncated and oversized frames, zero and huge dimensions,
  out-of-range ids, duplicates, a response too large for a frame: each gets
  an error reply naming the request, and the worker then serves a valid
  request whose output is identical, byte for byte, to the probe's own
  computation with common/'s kernels;
- pipelined requests, a slow reader (backpressure: nothing dropped),
  heartbeats, status, prefetch hints, a silent connection (closed after the
  5 s handshake deadline);
- 1000 connect / partial-send / drop cycles leave the worker's RSS and open
  file descriptors flat;
- a cluster key: a peer without it or with another key is refused with a
  clear message that the worker logs; with it, requests work;
- a non-loopback --listen without a key exits 2 with one line; a directory
  that is neither a container nor a checkpoint is refused with a hint to
  run `shoal convert` (a checkpoint is converted: test_quickstart.py);
- --shard I/N: two workers cover complementary halves, and an expert
  outside the shard gets an error reply;
- --join: the worker dials a coordinator that is not up yet, serves it,
  and re-dials when it hangs up (two sessions).

Usage: /usr/bin/python3 tests/cluster/test_worker.py --worker BIN --probe BIN --shoal BIN
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import harness as H  # noqa: E402
from harness import ROOT, MODEL  # noqa: E402,F401
procs = []


result = H.Results()


def env():
    e = dict(os.environ)
    # under AddressSanitizer freed memory waits in a quarantine, which would
    # read as RSS growth in the churn check; sanitizer errors abort
    asan = e.get("ASAN_OPTIONS", "")
    e["ASAN_OPTIONS"] = (asan + ":" if asan else "") + \
        "quarantine_size_mb=0:thread_local_quarantine_size_kb=0:abort_on_error=1"
    e.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
    return e


class Worker:
    """A shoal-worker process with its log in a file."""

    def __init__(self, binary, tmp, name, *flags):
        self.log_path = os.path.join(tmp, name + ".log")
        self.log = open(self.log_path, "w")
        self.p = subprocess.Popen([binary] + list(flags), stdout=self.log,
                                  stderr=subprocess.STDOUT, env=env())
        procs.append(self.p)
        self.addr = None

    def wait_ready(self, timeout=60):
        """Wait for the 'serving' line; returns the bound address or None."""
        m = H.wait_for(lambda: self.text() if "serving " in self.text() else "",
                       r"listening on (\S+)", self.p, timeout)
        self.addr = m.group(1) if m else None
        return self.addr

    def text(self):
        with open(self.log_path) as f:
            return f.read()

    def alive(self):
        return self.p.poll() is None

    def rss_kb(self):
        with open("/proc/%d/status" % self.p.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return -1

    def fds(self):
        return len(os.listdir("/proc/%d/fd" % self.p.pid))

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()
        text = self.text()
        reports = [l for l in text.splitlines()
                   if "Sanitizer" in l or "runtime error" in l]
        result("%s: no sanitizer report" % os.path.basename(self.log_path), not reports,
               "\n".join(reports[:5]))
        return self.p.returncode


def probe(args, worker, scenario, *extra, key=None, role=None, model=None, timeout=180):
    cmd = [args.probe, "--addr", worker.addr, "--model", model or args.container]
    if key:
        cmd += ["--key", key]
    if role:
        cmd += ["--role", role]
    cmd += [scenario] + [str(x) for x in extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env())
    return r.returncode, r.stdout + r.stderr


def probe_ok(args, worker, name, scenario, *extra, **kw):
    rc, out = probe(args, worker, scenario, *extra, **kw)
    ok = rc == 0 and "FAIL" not in out and "ok " in out
    last = [l for l in out.strip().splitlines() if l]
    result(name, ok, last[-1] if ok and last else "rc=%d\n%s" % (rc, out))
    return ok, out


def bad_scenarios(args, w):
    for sc in ["malformed", "oversized", "zero-length", "huge-length", "truncated",
               "zero-dims", "huge-dims", "bad-expert", "bad-layer", "rows-mismatch",
               "dup-expert", "bad-row", "id-zero", "big-response"]:
        ok, out = probe_ok(args, w, "bad frame: " + sc, sc)
        if ok:
            n_err = out.count("error reply")
            if sc != "truncated":
                result("bad frame: %s answered with error replies" % sc, n_err >= 1,
                       "%d error replies" % n_err)
        probe_ok(args, w, "valid request after " + sc, "valid")
        result("worker alive after " + sc, w.alive())


def churn(args, w):
    probe_ok(args, w, "churn warm-up 200", "churn", 200)
    time.sleep(1.0)
    rss0, fd0 = w.rss_kb(), w.fds()
    ok, out = probe_ok(args, w, "churn 1000", "churn", 1000, timeout=600)
    time.sleep(1.5)   # let the worker see every close
    rss1, fd1 = w.rss_kb(), w.fds()
    result("churn: RSS flat (+2 MiB at most)", rss1 - rss0 <= 2048,
           "%d kB -> %d kB" % (rss0, rss1))
    result("churn: open fds flat", 0 <= fd1 - fd0 <= 2 or fd1 <= fd0, "%d -> %d" % (fd0, fd1))
    probe_ok(args, w, "valid request after churn", "valid")
    ok, out = probe_ok(args, w, "status after churn", "status")
    m = re.search(r"connections=(\d+)", out)
    result("status: only the probe's connection open", m and m.group(1) == "1",
           m.group(0) if m else out)


def keyed(args, tmp):
    key = os.path.join(tmp, "cluster.key")
    other = os.path.join(tmp, "other.key")
    with open(key, "w") as f:
        f.write("c2hvYWwtdGVzdC1jbHVzdGVyLWtleS0wMTIzNDU2Nzg5\n")
    with open(other, "w") as f:
        f.write("YW5vdGhlci1rZXktbm90LXRoZS1jbHVzdGVyLW9uZQ==\n")
    os.chmod(key, 0o600)
    os.chmod(other, 0o600)
    w = Worker(args.worker, tmp, "keyed", "--model", args.container, "--listen",
               "127.0.0.1:0", "--cluster-key", key)
    try:
        if not w.wait_ready():
            result("keyed worker starts", False, w.text())
            return
        result("keyed worker says every peer must authenticate",
               "every peer must authenticate" in w.text())
        rc, out = probe(args, w, "auth")
        result("no key: refused with a clear message", rc == 1 and "refused" in out and
               "cluster key" in out and "ok auth" not in out, out.strip())
        rc, out = probe(args, w, "auth", key=other)
        result("wrong key: refused with a clear message", rc == 1 and "refused" in out and
               "cluster key" in out and "ok auth" not in out, out.strip())
        time.sleep(0.3)
        log = w.text()
        refusals = [l for l in log.splitlines() if "refused" in l]
        result("worker logs the refusals with the peer address",
               len(refusals) >= 2 and all("127.0.0.1:" in l for l in refusals),
               "\n".join(refusals[:2]))
        probe_ok(args, w, "right key: valid request", "valid", key=key)
        rc, out = probe(args, w, "auth", key=key, role="worker")
        result("a worker peer is refused", rc == 1 and "coordinator" in out, out.strip())
        result("keyed worker alive", w.alive())
    finally:
        w.stop()


def usage_errors(args, tmp):
    r = subprocess.run([args.worker, "--model", args.container, "--listen", "0.0.0.0:0"],
                       capture_output=True, text=True, timeout=60, env=env())
    lines = r.stderr.strip().splitlines()
    result("non-loopback --listen without a key: exit 2, one line",
           r.returncode == 2 and len(lines) == 1 and "loopback" in lines[0], r.stderr.strip())
    r = subprocess.run([args.worker, "--model", args.container, "--listen", "127.0.0.1:0",
                        "--join", "10.1.2.3:7000"],
                       capture_output=True, text=True, timeout=60, env=env())
    result("non-loopback --join without a key: exit 2",
           r.returncode == 2 and "loopback" in r.stderr, r.stderr.strip())
    r = subprocess.run([args.worker, "--model", tmp, "--listen", "127.0.0.1:0"],
                       capture_output=True, text=True, timeout=60, env=env())
    lines = r.stderr.strip().splitlines()
    result("neither a container nor a checkpoint: one line naming shoal convert",
           r.returncode == 2 and len(lines) == 1 and "shoal convert" in lines[0],
           r.stderr.strip())
    r = subprocess.run([args.worker, "--model", args.container, "--shard", "2/2"],
                       capture_output=True, text=True, timeout=60, env=env())
    result("--shard 2/2 refused (I < N)", r.returncode == 2 and "--shard" in r.stderr,
           r.stderr.strip())


def damaged(args, tmp):
    """A flipped byte in one expert's blob: that request gets an error reply
    naming the layer and expert; the worker serves the next one."""
    import json
    bad = os.path.join(tmp, "damaged")
    shutil.copytree(args.container, bad)
    with open(os.path.join(bad, "shoal.json")) as f:
        ex = json.load(f)["experts"]
    layer = ex["layers"][-1]
    off = layer["offset"] + (ex["n_expert"] - 1) * ex["blob_bytes"] + 100
    with open(os.path.join(bad, "experts.bin"), "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0x40]))
    w = Worker(args.worker, tmp, "damaged", "--model", bad, "--listen", "127.0.0.1:0")
    try:
        if not w.wait_ready():
            result("worker on a damaged container starts", False, w.text())
            return
        ok, out = probe_ok(args, w, "damaged blob: error reply, then a valid request",
                           "store-error", model=bad)
        m = re.search(r"ok damaged expert blob: error reply id=66 (\S+): (.*)", out)
        result("damaged blob: the error names the layer and expert",
               m is not None and ("layer %d" % layer["layer"]) in m.group(2) and
               ("expert %d" % (ex["n_expert"] - 1)) in m.group(2), m.group(0) if m else out)
        result("damaged blob: worker alive", w.alive())
    finally:
        w.stop()


def coverage_bits(out):
    m = re.search(r"coverage=([0-9a-f]*)", out)
    if not m:
        return None
    b = bytes.fromhex(m.group(1))
    return {i for i in range(len(b) * 8) if (b[i // 8] >> (i % 8)) & 1}


def shards(args, tmp):
    ws = [Worker(args.worker, tmp, "shard%d" % i, "--model", args.container, "--listen",
                 "127.0.0.1:0", "--shard", "%d/2" % i) for i in range(2)]
    try:
        if not all(w.wait_ready() for w in ws):
            result("shard workers start", False, ws[0].text() + ws[1].text())
            return
        covs = []
        for i, w in enumerate(ws):
            rc, out = probe(args, w, "auth")
            covs.append(coverage_bits(out) if rc == 0 else None)
        ok = all(c is not None for c in covs)
        if ok:
            a, b = covs
            result("--shard 0/2 and 1/2 cover complementary halves",
                   a and b and not (a & b) and len(a | b) == 32,
                   "%d + %d experts" % (len(a), len(b)))
        else:
            result("--shard workers report coverage", False)
        for i, w in enumerate(ws):
            probe_ok(args, w, "shard %d/2: an expert outside the shard is refused" % i,
                     "not-held")
            probe_ok(args, w, "shard %d/2: valid requests on its experts" % i, "valid")
    finally:
        for w in ws:
            w.stop()


def join(args, tmp):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    # the coordinator is not up yet: the worker must keep re-dialling
    w = Worker(args.worker, tmp, "join", "--model", args.container, "--listen", "127.0.0.1:0",
               "--join", "127.0.0.1:%d" % port)
    try:
        if not w.wait_ready():
            result("joining worker starts", False, w.text())
            return
        time.sleep(1.5)
        r = subprocess.run([args.probe, "--addr", "127.0.0.1:%d" % port, "--model",
                            args.container, "serve", "2"], capture_output=True, text=True,
                           timeout=120, env=env())
        out = r.stdout + r.stderr
        result("--join: serves a coordinator that came up late, re-dials after it hangs up",
               r.returncode == 0 and out.count("ok serve") == 2, out.strip())
        log = w.text()
        result("--join: the worker logged failed dials and two sessions",
               "cannot reach coordinator" in log and log.count("connected to coordinator") >= 2)
    finally:
        w.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", required=True)
    ap.add_argument("--probe", required=True)
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="shoal-worker-test-")
    args.container = os.path.join(tmp, "c")
    try:
        r = subprocess.run([args.shoal, "convert", MODEL, args.container, "--experts", "int4"],
                           capture_output=True, text=True, timeout=300, env=env())
        if r.returncode != 0:
            result("convert the bundled model", False, r.stderr)
            return 1
        usage_errors(args, tmp)
        w = Worker(args.worker, tmp, "worker", "--model", args.container, "--listen",
                   "127.0.0.1:0")
        try:
            addr = w.wait_ready()
            result("worker starts on a free loopback port", addr is not None,
                   addr or w.text())
            if not addr:
                return 1
            result("worker says it listens on loopback only", "loopback only" in w.text())
            probe_ok(args, w, "auth: PeerInfo", "auth")
            probe_ok(args, w, "valid: every covered expert identical", "valid")
            bad_scenarios(args, w)
            probe_ok(args, w, "pipeline of 32 requests", "pipeline", 32)
            probe_ok(args, w, "an answer in parts (ExpertRequest.parts 3): 2-3 frames, the "
                     "same bytes", "parts", 3)
            probe_ok(args, w, "slow reader: backpressure, nothing dropped", "backpressure", 12,
                     timeout=600)
            result("worker logged the backpressure pause", "reading paused" in w.text())
            probe_ok(args, w, "replies to a dropped connection discarded, next one served",
                     "drop-inflight", 6)
            result("worker alive after drop-inflight", w.alive())
            probe_ok(args, w, "heartbeat echo", "heartbeat")
            probe_ok(args, w, "prefetch hint then valid", "hint")
            probe_ok(args, w, "status", "status")
            probe_ok(args, w, "silent connection closed at the handshake deadline",
                     "no-handshake")
            result("worker logged the handshake timeout", "no handshake within" in w.text())
            churn(args, w)
            result("worker alive at the end", w.alive())
        finally:
            rc = w.stop()
            result("worker exits 0 on SIGTERM", rc == 0, "rc=%s" % rc)
        keyed(args, tmp)
        damaged(args, tmp)
        shards(args, tmp)
        join(args, tmp)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if args.keep:
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return result.summary()


if __name__ == "__main__":
    sys.exit(main())
