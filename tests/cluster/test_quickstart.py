#!/usr/bin/env python3
"""The README's cluster quick start, on real processes, on the bundled model.

As the README says (only the ports differ: free ones instead of 7070/7071,
and `--control off` so parallel tests do not share 127.0.0.1:7077):

    shoal-worker --model models/shakespeare-moe --shard 0/2 --listen 127.0.0.1:7070 &
    shoal-worker --model models/shakespeare-moe --shard 1/2 --listen 127.0.0.1:7071 &
    shoal run --workers 127.0.0.1:7070,127.0.0.1:7071 --local-experts off \\
              --prompt "ROMEO:" --stats

Checks:
- the two workers start at the same time on the Hugging Face checkpoint:
  they convert it once into $XDG_CACHE_HOME/shoal (a temporary directory
  here) with a notice, the concurrent conversions leave exactly one
  container and no temporary directory, and it passes `shoal inspect
  --verify`;
- the coordinator command finds the same cached container (no second
  conversion), both workers served requests (--stats: each worker's
  executor line has requests > 0; the local store none: each expert has
  one holder, so this holds whatever the measured rates), and the text,
  token ids and logits bytes equal the in-process run on the checkpoint
  (`shoal run --prompt "ROMEO:"`) bit for bit;
- a worker restarted on the same checkpoint reuses the cache.

Usage: /usr/bin/python3 tests/cluster/test_quickstart.py --shoal BIN --worker BIN
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

from clusterlib import (MODEL, Gen, Results, Worker, detail, free_port, kill_all, same,
                        stop_workers)

R = Results()
result = R
PROMPT = ["--prompt", "ROMEO:"]
GEN = ["--max-tokens", "64"]


def executor_requests(err, addr):
    m = re.search(r"executor \d+ %s: up, \d+ experts, (\d+) requests" % re.escape(addr), err)
    return int(m.group(1)) if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--worker", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="shoal_quickstart_") as tmp:
        # every process below (clusterlib's env() copies os.environ) uses
        # this cache, never the user's ~/.cache
        os.environ["XDG_CACHE_HOME"] = os.path.join(tmp, "xdg")
        cache = os.path.join(tmp, "xdg", "shoal")
        # the reference: in-process, straight from the checkpoint
        base = Gen(args.shoal, tmp, "inproc", MODEL, PROMPT, GEN)
        result("in-process run on the checkpoint", base.rc == 0 and base.logits, detail(base))
        addrs = ["127.0.0.1:%d" % free_port() for _ in range(2)]
        ws = [Worker(args.worker, tmp, "qs-%d" % i, MODEL, "--shard", "%d/2" % i, listen=a)
              for i, a in enumerate(addrs)]  # both start before either is ready
        try:
            up = [w.wait_ready() for w in ws]
            result("two workers on the checkpoint come up", all(up),
                   " | ".join(w.text()[-400:] for w in ws))
            if not all(up):
                return R.summary()
            notices = sum("converting '%s' once" % MODEL in w.text() for w in ws)
            result("the workers say they convert once", notices >= 1,
                   " | ".join(w.text()[:300] for w in ws))
            entries = sorted(os.listdir(cache))
            result("concurrent conversions leave one container, no temporary directory",
                   len(entries) == 1 and entries[0].endswith(".shoal"), str(entries))
            ct = os.path.join(cache, entries[0])
            served = [re.search(r"serving (\S+) ", w.text()) for w in ws]
            result("both workers serve the cached container",
                   all(m and m.group(1) == ct for m in served),
                   str([m.group(1) if m else None for m in served]))
            v = subprocess.run([args.shoal, "inspect", ct, "--verify"], capture_output=True,
                               text=True, timeout=120)
            result("the cached container verifies", v.returncode == 0, v.stderr[-400:])
            # the README's coordinator command
            g = Gen(args.shoal, tmp, "cluster", MODEL, PROMPT, GEN,
                    ["--workers", ",".join(addrs), "--local-experts", "off", "--stats",
                     "--control", "off"])
            result("the coordinator command runs, reusing the cache (no second notice)",
                   g.rc == 0 and "converting" not in g.err and len(os.listdir(cache)) == 1,
                   detail(g))
            reqs = [executor_requests(g.err, a) for a in addrs]
            result("both workers served requests (--stats)",
                   all(r is not None and r > 0 for r in reqs), "%s\n%s" % (reqs, g.err[-800:]))
            local = re.search(r"executor 0 local: \S+, \d+ experts, (\d+) requests", g.err)
            result("the coordinator's own store served none (--local-experts off)",
                   local is None or local.group(1) == "0", g.err[-400:])
            result("text, ids and logits equal the in-process run bit for bit",
                   same(g, base) and g.out == base.out, detail(g))
            # a restarted worker reuses the cache
            ws[0].stop()
            w2 = Worker(args.worker, tmp, "qs-restart", MODEL, listen="127.0.0.1:0")
            ws.append(w2)
            ok = w2.wait_ready() is not None
            result("a restarted worker reuses the cached container",
                   ok and "converting" not in w2.text() and len(os.listdir(cache)) == 1,
                   w2.text()[-400:])
        finally:
            stop_workers(ws)
            kill_all()
    return R.summary()


if __name__ == "__main__":
    sys.exit(main())
