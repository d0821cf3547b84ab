#!/usr/bin/env python3
"""A worker's link cut mid-decode (issue 33): no reset reaches the
coordinator, only silence. Three workers in network namespaces hold every
expert twice (--shard I/3:2); `shoal run` (--local-experts off,
--request-timeout 120) streams a decode and worker 0's link goes down (its
veth in the root namespace) after the first tokens. The connection is
dropped once its bytes stay unacknowledged (cluster_net.c: TCP_USER_TIMEOUT),
not after the request timeout: stderr names a timed-out connection and no
timed-out request, and the token ids, text and logits bytes equal the
in-process run's. Needs root; skipped otherwise.

Usage: /usr/bin/python3 tests/cluster/test_link_cut.py --shoal BIN --worker BIN
"""
import argparse
import base64
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import clusterlib as L  # noqa: E402
import netlab  # noqa: E402

R = L.Results()
SHORT = "ROMEO:\nBut soft, what light through yonder window breaks?\nJULIET:\n"
GEN = ["--max-tokens", "400", "--seed", "7", "--temp", "0.8", "--ignore-eos"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--worker", required=True)
    a = ap.parse_args()
    ok, why = netlab.Lab.available()
    if not ok:
        R.skip("a worker's link cut mid-decode", why)
        return R.summary()
    tmp = tempfile.mkdtemp(prefix="shoal-linkcut-")
    ct = os.path.join(tmp, "ct")
    r = L.run([a.shoal, "convert", L.MODEL, ct, "--experts", "int4a8"])
    if not R("convert the bundled model (int4a8)", r.returncode == 0, r.stderr[-500:]):
        return R.summary()
    base = L.Gen(a.shoal, tmp, "base", ct, ["--prompt", SHORT], GEN)
    if not R("in-process run", base.rc == 0, L.detail(base)):
        return R.summary()
    key = os.path.join(tmp, "key")
    with open(key, "w") as f:
        f.write(base64.b64encode(os.urandom(32)).decode() + "\n")
    os.chmod(key, 0o600)
    ws = []
    with netlab.Lab(prefix="shoallc%d" % os.getpid()) as lab:
        try:
            hosts = [lab.add_host("w%d" % i, rate="1gbit") for i in range(3)]
            for i, h in enumerate(hosts):
                ws.append(L.Worker(a.worker, tmp, "w%d" % i, ct, "--cluster-key", key,
                                   "--shard", "%d/3:2" % i, "--announce", "off",
                                   listen="%s:7070" % h.addr, launch=h.popen))
            if not R("3 workers in namespaces, every expert on 2",
                     all(w.wait_ready() for w in ws), ws[0].text()[-500:]):
                return R.summary()
            logits = os.path.join(tmp, "cut.npy")
            ids = os.path.join(tmp, "cut.ids")
            cmd = [a.shoal, "run", "--model", ct, "--prompt", SHORT, "--logits-out", logits,
                   "--ids-out", ids] + GEN + [
                "--workers", ",".join("%s:7070" % h.addr for h in hosts),
                "--cluster-key", key, "--local-experts", "off", "--request-timeout", "120",
                "--stats"]
            errf = open(os.path.join(tmp, "cut.err"), "w+")
            t0 = time.time()
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errf, env=L.env())
            out = b""
            while len(out) < len(SHORT) + 40:   # the prompt's echo and the first tokens
                b = p.stdout.read1(1 << 16)
                if not b:
                    break
                out += b
            subprocess.run(["ip", "link", "set", hosts[0].veth_root, "down"], check=True)
            rest = p.stdout.read()
            rc = p.wait(timeout=300)
            seconds = time.time() - t0
            errf.seek(0)
            err = errf.read()
            text = (out + rest).decode("utf-8", "replace")
            same = (rc == 0 and L.read_bytes(logits) == base.logits and
                    (L.read_bytes(ids) or b"").decode() == base.ids and text == base.out)
            R("link cut mid-decode: ids, text and logits bytes = in-process", same,
              "rc=%d %.1fs stderr: %s" % (rc, seconds, err[-800:]))
            R("worker 0's connection dropped as timed out; no request waited for its timeout",
              re.search(r"worker %s\S* is down: .*timed out" % re.escape(hosts[0].addr), err) is not None and
              re.search(r"request \d+ timed out", err) is None,
              "%.1fs stderr: %s" % (seconds, err[-800:]))
        finally:
            L.stop_workers(ws)
    return R.summary()


if __name__ == "__main__":
    sys.exit(main())
