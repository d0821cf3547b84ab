#!/usr/bin/env python3
"""Finding the cluster on a LAN (issue 33): `--workers auto` and
`shoal status --workers auto` against workers that announce themselves
as mDNS/DNS-SD `_shoal._tcp` services (common/net/discover.h).

Without namespaces (any user):
1. usage: `--workers auto` without --cluster-key, mixed with an address, or
   `status --workers` other than auto: exit 2 and one line.

On one LAN of network namespaces (netlab lan=True: veths on a bridge,
multicast on; root only, skipped with the reason otherwise):
2. hosts a and b run a worker with key K on :7070; b also runs one with key
   K2 on :7071, and one without a key (loopback only, so it never
   announces); host c browses:
   - `shoal status --workers auto --cluster-key K` lists exactly a:7070 and
     b:7070, with the model's fingerprint, one line each, exit 0, within
     the browse time; with K2 exactly b:7071; --json likewise;
   - `shoal run --workers auto --cluster-key K` (greedy, a few tokens, the
     local experts off) gives logits bytes, ids and text identical to the
     same run with the two workers named;
   - a key no worker has: exit 1 and one line naming what was seen; no key:
     exit 2 and one line;
   - a hostile host d (mdns_flood.py) sends 300 malformed services (bad
     TXT, huge TXT, control bytes, a NUL, short A records, another key):
     status still lists exactly a:7070 and b:7070; then 120 services with
     the right key id (copied: it is public) at bogus addresses: status
     keeps at most 63 and exits 0, without a crash;
   - the workers withdraw on SIGTERM and exit 0.

Usage: /usr/bin/python3 tests/cluster/test_discover.py --shoal BIN --worker BIN [--keep]
"""
import argparse
import hashlib
import hmac
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import clusterlib as L  # noqa: E402
from clusterlib import Gen, same, detail  # noqa: E402

KEYS = {"K": "c2hvYWwtdGVzdC1jbHVzdGVyLWtleS0wMTIzNDU2Nzg5\n",
        "K2": "YW5vdGhlci1jbHVzdGVyLWtleS1mb3ItdGhlLXRlc3Q=\n",
        "K3": "YS10aGlyZC1rZXktdGhhdC1ubyB3b3JrZXIgaGFz\n"}
PROMPT = ["--prompt", "ROMEO:\n"]
GEN = ["--max-tokens", "6", "--greedy", "--ignore-eos"]
QUIET = ["--local-experts", "off", "--control", "off"]
BROWSE_S = 2.0

check = L.Results()


def one_line(err):
    return len(err.strip().splitlines()) == 1


def usage_checks(args, keys, tmp):
    r = L.run([args.shoal, "run", "--model", args.ct, "--workers", "auto"] + PROMPT + GEN)
    check("run --workers auto without --cluster-key: exit 2, one line",
          r.returncode == 2 and one_line(r.stderr) and "--cluster-key" in r.stderr,
          "rc=%d %s" % (r.returncode, r.stderr.strip()))
    r = L.run([args.shoal, "run", "--model", args.ct, "--workers", "auto",
               "--workers", "127.0.0.1:7070", "--cluster-key", keys["K"]] + PROMPT + GEN)
    check("--workers auto with an address too: exit 2, one line",
          r.returncode == 2 and one_line(r.stderr), "rc=%d %s" % (r.returncode, r.stderr))
    r = L.run([args.shoal, "status", "--workers", "auto"])
    check("status --workers auto without --cluster-key: exit 2, one line",
          r.returncode == 2 and one_line(r.stderr) and "--cluster-key" in r.stderr,
          "rc=%d %s" % (r.returncode, r.stderr.strip()))
    r = L.run([args.shoal, "status", "--workers", "10.0.0.1:7070", "--cluster-key", keys["K"]])
    check("status --workers ADDR: exit 2, one line", r.returncode == 2 and one_line(r.stderr),
          "rc=%d %s" % (r.returncode, r.stderr))


def key_id(path):
    """docs/PROTOCOL.md "Discovery": the first 8 bytes of
    HMAC-SHA-256(key, label) in hex, the key being SHA-256 of the file's
    secret without surrounding whitespace."""
    with open(path, "rb") as f:
        key = hashlib.sha256(f.read().strip()).digest()
    return hmac.new(key, b"shoal discovery key id v1", hashlib.sha256).hexdigest()[:16]


def flood(host, keyid, mode, count, seconds):
    """mdns_flood.py on host, running for seconds (started, not waited)."""
    return host.popen(["/usr/bin/python3", os.path.join(HERE, "mdns_flood.py"), "--addr",
                       host.addr, "--keyid", keyid, "--mode", mode, "--count", str(count),
                       "--seconds", str(seconds)])


def mdns_in_build(args, keys):
    """(True, "") or (False, why)."""
    r = L.run([args.shoal, "status", "--workers", "auto", "--cluster-key", keys["K"],
               "--discover-timeout", "0.1"])
    if "no mDNS" in r.stderr:
        return False, r.stderr.strip()
    return True, ""


def wait_announced(w, timeout=30):
    """The worker's log says its service is established."""
    end = time.time() + timeout
    while time.time() < end:
        if "announced '" in w.text():
            return True
        if not w.alive():
            return False
        time.sleep(0.1)
    return False


def lan(args, keys, tmp):
    import netlab as N
    ok, why = N.Lab.available()
    if not ok:
        check.skip("mDNS between network namespaces", why)
        return
    fingerprint = json.load(open(os.path.join(args.ct, "shoal.json"))).get("fingerprint")
    with N.Lab() as lab:
        a, b, c, d = (lab.add_host(n, lan=True) for n in ("a", "b", "c", "d"))

        def on(h):
            return lambda argv, **kw: h.popen(argv, **kw)
        # a wrapper that runs shoal in c's namespace (Gen takes a binary)
        shoal_c = os.path.join(tmp, "shoal-in-c")
        with open(shoal_c, "w") as f:
            f.write('#!/bin/sh\nexec ip netns exec %s %s "$@"\n' % (c.ns, args.shoal))
        os.chmod(shoal_c, 0o755)
        ws = []
        try:
            same_key = [L.Worker(args.worker, tmp, "wa", args.ct, "--cluster-key", keys["K"],
                                 "--threads", "1", listen=a.addr + ":7070", launch=on(a)),
                        L.Worker(args.worker, tmp, "wb", args.ct, "--cluster-key", keys["K"],
                                 "--threads", "1", listen=b.addr + ":7070", launch=on(b))]
            other = L.Worker(args.worker, tmp, "wb2", args.ct, "--cluster-key", keys["K2"],
                             "--threads", "1", listen=b.addr + ":7071", launch=on(b))
            nokey = L.Worker(args.worker, tmp, "wb3", args.ct, "--threads", "1",
                             listen="127.0.0.1:7072", launch=on(b))
            ws = same_key + [other, nokey]
            up = [w.wait_ready() for w in ws]
            if not check("4 workers up (2 of key K, 1 of K2, 1 without a key)", all(up),
                         "%s; %s" % (up, [w.text()[-300:] for w in ws if not w.addr])):
                return
            announced = [wait_announced(w) for w in same_key + [other]]
            if not check("the keyed workers announce themselves", all(announced),
                         [w.text()[-400:] for w in ws]):
                return
            check("the worker without a key does not announce",
                  "announced '" not in nokey.text(), nokey.text()[-300:])
            want = sorted(w.addr for w in same_key)

            t0 = time.time()
            r = L.run([shoal_c, "status", "--workers", "auto", "--cluster-key", keys["K"]])
            secs = time.time() - t0
            lines = r.stdout.strip().splitlines()
            found = [ln.split()[0] for ln in lines]
            check("status --workers auto (K): exactly the 2 workers of K, one line each",
                  r.returncode == 0 and found == want,
                  "rc=%d found %s want %s; %s" % (r.returncode, found, want, r.stderr.strip()))
            check("status --workers auto: each line has the name and the model fingerprint",
                  len(lines) == 2 and all(fingerprint and fingerprint in ln and " name " in ln
                                          for ln in lines), r.stdout)
            check("status --workers auto: browses about %g s (took %.1f s)" % (BROWSE_S, secs),
                  BROWSE_S - 0.1 <= secs < BROWSE_S + 3, "%.2f s" % secs)
            r = L.run([shoal_c, "status", "--workers", "auto", "--cluster-key", keys["K2"],
                       "--json"])
            try:
                got = json.loads(r.stdout)
            except ValueError:
                got = None
            check("status --workers auto --json (K2): exactly the worker of K2",
                  r.returncode == 0 and got and [w["address"] for w in got] == [other.addr] and
                  got[0].get("fingerprint") == fingerprint,
                  "rc=%d %s %s" % (r.returncode, r.stdout, r.stderr.strip()))
            r = L.run([shoal_c, "status", "--workers", "auto", "--cluster-key", keys["K3"]])
            check("status --workers auto with a key no worker has: exit 1, one line",
                  r.returncode == 1 and not r.stdout.strip() and one_line(r.stderr) and
                  "no shoal-worker" in r.stderr,
                  "rc=%d %s %s" % (r.returncode, r.stdout, r.stderr.strip()))

            g_named = Gen(shoal_c, tmp, "named", args.ct, PROMPT, GEN,
                          ["--workers", ",".join(want), "--cluster-key", keys["K"]] + QUIET)
            g_auto = Gen(shoal_c, tmp, "auto", args.ct, PROMPT, GEN,
                         ["--workers", "auto", "--cluster-key", keys["K"]] + QUIET)
            check("run with the workers named: ok", g_named.rc == 0 and g_named.out,
                  detail(g_named))
            check("run --workers auto: logits bytes, ids and text identical to the workers "
                  "named", same(g_auto, g_named), detail(g_auto))
            check("run --workers auto: says which workers it found",
                  "found 2 workers: %s" % ",".join(want) in g_auto.err, g_auto.err[-400:])
            g = Gen(shoal_c, tmp, "wrongkey", args.ct, PROMPT, GEN,
                    ["--workers", "auto", "--cluster-key", keys["K3"]] + QUIET)
            check("run --workers auto with a key no worker has: exit 1, one line",
                  g.rc == 1 and one_line(g.err) and "no shoal-worker" in g.err, detail(g))
            g = Gen(shoal_c, tmp, "nokey", args.ct, PROMPT, GEN, ["--workers", "auto"] + QUIET)
            check("run --workers auto without a key: exit 2, one line",
                  g.rc == 2 and one_line(g.err), detail(g))

            # a hostile host on the LAN
            kid = key_id(keys["K"])
            # twice the default browse: on 2 busy cores (the suites run in
            # parallel) the flood's resolves once delayed a real worker past
            # 2 s; the check is that none is crowded out, not the latency
            fl = flood(d, kid, "malformed", 300, 2 * BROWSE_S + 6)
            time.sleep(0.5)
            r = L.run([shoal_c, "status", "--workers", "auto", "--cluster-key", keys["K"],
                       "--discover-timeout", str(2 * BROWSE_S)])
            found = [ln.split()[0] for ln in r.stdout.strip().splitlines()]
            check("300 malformed services on the LAN: status still lists exactly the 2 "
                  "workers of K", r.returncode == 0 and found == want,
                  "rc=%d found %s; %s" % (r.returncode, found, r.stderr.strip()[-300:]))
            # the flood arrived and was counted: a key no one has sees it all
            r = L.run([shoal_c, "status", "--workers", "auto", "--cluster-key", keys["K3"]])
            m = re.search(r"other keys: (\d+), malformed: (\d+)", r.stderr)
            check("the malformed services were seen, checked and dropped (counted)",
                  r.returncode == 1 and m and int(m.group(1)) >= 10 and int(m.group(2)) >= 50,
                  r.stderr.strip())
            L.harness.stop(fl)
            fl = flood(d, kid, "copied", 120, BROWSE_S + 4)
            time.sleep(0.5)
            r = L.run([shoal_c, "status", "--workers", "auto", "--cluster-key", keys["K"]])
            lines = r.stdout.strip().splitlines()
            check("120 services with a copied key id: at most 63 kept, exit 0, no crash",
                  r.returncode == 0 and 2 < len(lines) <= 63,
                  "rc=%d %d lines; %s" % (r.returncode, len(lines), r.stderr.strip()[-300:]))
            L.harness.stop(fl)
        finally:
            rcs = [w.stop() for w in ws]
        check("the workers exit 0 on SIGTERM", rcs and all(rc == 0 for rc in rcs), rcs)
        prefix = lab.prefix
    left = N.leftovers(prefix)
    check("namespaces removed", not left, str(left))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    args.shoal, args.worker = os.path.abspath(args.shoal), os.path.abspath(args.worker)

    def on_term(signum, frame):
        raise KeyboardInterrupt("SIGTERM")
    signal.signal(signal.SIGTERM, on_term)
    tmp = tempfile.mkdtemp(prefix="shoal-discover-")
    try:
        keys = {}
        for name, secret in KEYS.items():
            keys[name] = os.path.join(tmp, name + ".key")
            with open(keys[name], "w") as f:
                f.write(secret)
            os.chmod(keys[name], 0o600)
        args.ct = os.path.join(tmp, "ct")
        r = L.run([args.shoal, "convert", L.MODEL, args.ct])
        if not check("the bundled model as a container", r.returncode == 0, r.stderr[-400:]):
            return check.summary()
        usage_checks(args, keys, tmp)
        ok, why = mdns_in_build(args, keys)
        if not ok:
            check.skip("mDNS between network namespaces", why)
        else:
            try:
                lan(args, keys, tmp)
            except Exception as e:   # recorded, and the summary still prints
                check("mDNS between network namespaces", False, "exception: %r" % e)
    finally:
        L.kill_all()
        if args.keep:
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
