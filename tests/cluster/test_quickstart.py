#!/usr/bin/env python3
"""The README's cluster quick start, on real processes, on the bundled model.

The commands are read from README.md's "cluster on the bundled model"
section and run as written, except that the ports are free ones instead of
7070..., `--control off` (or a free port) so that parallel tests do not
share 127.0.0.1:7077, and --logits-out/--ids-out are added. Today they are:

    shoal-worker --model models/shakespeare-moe --shard 0/3:2 --listen 127.0.0.1:7070 &
    shoal-worker --model models/shakespeare-moe --shard 1/3:2 --listen 127.0.0.1:7071 &
    shoal-worker --model models/shakespeare-moe --shard 2/3:2 --listen 127.0.0.1:7072 &
    shoal run --workers 127.0.0.1:7070,127.0.0.1:7071,127.0.0.1:7072 \\
              --local-experts off --prompt "ROMEO:" --stats

Checks:
- the workers start at the same time on the Hugging Face checkpoint: they
  convert it once into $XDG_CACHE_HOME/shoal (a temporary directory here)
  with a notice, the concurrent conversions leave exactly one container
  and no temporary directory, and it passes `shoal inspect --verify`;
- every expert has at least two holders among the README's workers (as
  the README says: its example survives a worker's death): each worker's
  `--shard I/N:R` has R >= 2 and their experts add up to R times the model's;
- the coordinator command finds the same cached container (no second
  conversion), the workers served requests (--stats; the local store
  none, and its --stats is one line saying so, not five of zeros), and the
  text, token ids and logits bytes equal the in-process run
  on the checkpoint (`shoal run --prompt "ROMEO:"`) bit for bit;
- the coordinator command again, with the worker that served most so far
  killed (-9) mid-run (the coordinator is paused with SIGSTOP around the
  kill): exit 0, the worker reported down, and the text, ids and logits
  still equal the in-process run (issue 32 item 3);
- a worker restarted on the same checkpoint reuses the cache.

Usage: /usr/bin/python3 tests/cluster/test_quickstart.py --shoal BIN --worker BIN
"""
import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile

import clusterlib as L
from clusterlib import (MODEL, ROOT, Gen, Results, Worker, detail, env, free_port, kill_all,
                        read_rest, read_until, same, stop_workers)

R = Results()
result = R
README = os.path.join(ROOT, "README.md")


def readme_commands():
    """The worker command lines (argv after the binary, '&' dropped) and
    the coordinator's (argv after 'run') of README.md's cluster section."""
    text = open(README).read()
    m = re.search(r"^## A [\w-]+ cluster on the bundled model\n(.*?)^## ", text, re.S | re.M)
    if not m:
        return None, None
    block = re.search(r"```sh\n(.*?)```", m.group(1), re.S)
    workers, coord = [], None
    commands = []
    for line in (block.group(1) if block else "").splitlines():
        commands.append([])
        for word in shlex.split(line, comments=True):
            if word == "&":
                commands.append([])
            else:
                commands[-1].append(word)
    for argv in commands:
        if argv and argv[0].endswith("shoal-worker"):
            workers.append(argv[1:])
        elif argv[:2] and argv[0].endswith("/shoal") and argv[1] == "run":
            coord = argv[2:]
    return workers, coord


def take(argv, flag):
    """argv without flag and its value; and that value."""
    i = argv.index(flag)
    return argv[:i] + argv[i + 2:], argv[i + 1]


def executor_line(err, addr):
    return re.search(r"executor \d+ %s: (\w+), (\d+) experts, (\d+) requests" % re.escape(addr),
                     err)


def killed_run(args, tmp, coord_flags, ws):
    """The README's coordinator command; once text flows, pause it, kill -9
    the worker that served most so far, resume it. Returns (rc, out, err,
    logits, ids, victim, bytes printed before the kill)."""
    logits = os.path.join(tmp, "killed.npy")
    ids = os.path.join(tmp, "killed.ids")
    control = "127.0.0.1:%d" % free_port()
    cmd = [args.shoal, "run", "--model", MODEL, "--logits-out", logits, "--ids-out", ids] + \
        coord_flags + ["--control", control]
    errf = open(os.path.join(tmp, "killed.err"), "w+")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errf, env=env())
    L.procs.append(p)
    head = read_until(p, rb"ROMEO:[\s\S]{12}", 120)
    st = L.status_json(args.shoal, control)
    used = {e["address"]: e["requests"] for e in (st or {}).get("executors", [])}
    victim = max(ws, key=lambda w: used.get(w.addr, 0))
    os.kill(p.pid, signal.SIGSTOP)
    victim.kill9()
    os.kill(p.pid, signal.SIGCONT)
    out = (head + read_rest(p)).decode("utf-8", "replace")
    rc = p.wait(timeout=180)
    errf.seek(0)
    err = errf.read()
    errf.close()
    lg = open(logits, "rb").read() if os.path.exists(logits) else None
    idt = open(ids).read() if os.path.exists(ids) else None
    return rc, out, err, lg, idt, victim, len(head)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--worker", required=True)
    args = ap.parse_args()
    wargs, coord = readme_commands()
    result("README.md's cluster section has worker commands and a `shoal run`",
           bool(wargs) and coord is not None and "--workers" in coord, "%s / %s" % (wargs, coord))
    if not wargs or coord is None or "--workers" not in coord:
        return R.summary()
    with tempfile.TemporaryDirectory(prefix="shoal_quickstart_") as tmp:
        # every process below (clusterlib's env() copies os.environ) uses
        # this cache, never the user's ~/.cache
        os.environ["XDG_CACHE_HOME"] = os.path.join(tmp, "xdg")
        cache = os.path.join(tmp, "xdg", "shoal")
        # the reference: in-process, straight from the checkpoint, as the
        # README names it: `shoal run --prompt "ROMEO:"`
        base = Gen(args.shoal, tmp, "inproc", MODEL, ["--prompt", "ROMEO:"], [])
        result("in-process run on the checkpoint", base.rc == 0 and base.logits, detail(base))
        ws = []
        for i, w in enumerate(wargs):  # all start before any is ready
            w, _ = take(w, "--listen")
            w, model = take(w, "--model")
            ws.append(Worker(args.worker, tmp, "qs-%d" % i, os.path.join(ROOT, model), *w,
                             listen="127.0.0.1:%d" % free_port()))
        try:
            up = [w.wait_ready() for w in ws]
            result("%d workers on the checkpoint come up" % len(ws), all(up),
                   " | ".join(w.text()[-400:] for w in ws))
            if not all(up):
                return R.summary()
            addrs = [w.addr for w in ws]
            notices = sum("converting '%s' once" % MODEL in w.text() for w in ws)
            result("the workers say they convert once", notices >= 1,
                   " | ".join(w.text()[:300] for w in ws))
            entries = sorted(os.listdir(cache))
            result("concurrent conversions leave one container, no temporary directory",
                   len(entries) == 1 and entries[0].endswith(".shoal"), str(entries))
            ct = os.path.join(cache, entries[0])
            served = [re.search(r"serving (\S+) ", w.text()) for w in ws]
            result("every worker serves the cached container",
                   all(m and m.group(1) == ct for m in served),
                   str([m.group(1) if m else None for m in served]))
            v = subprocess.run([args.shoal, "inspect", ct, "--verify"], capture_output=True,
                               text=True, timeout=120)
            result("the cached container verifies", v.returncode == 0, v.stderr[-400:])
            # every expert has two holders: --shard I/N:R with R >= 2, and
            # the held experts add up to R times the model's
            held = [re.search(r"(\d+) of (\d+) experts \(--shard \d+/\d+(?::(\d+))?\)", w.text())
                    for w in ws]
            reps = {int(m.group(3) or 1) for m in held if m}
            ok = all(held) and len(reps) == 1 and min(reps) >= 2 and \
                sum(int(m.group(1)) for m in held) == min(reps) * int(held[0].group(2))
            result("README's workers give every expert at least two holders (survives a "
                   "worker's death)", ok,
                   str([m.group(0) if m else None for m in held]))
            # the README's coordinator command
            flags, _ = take(coord, "--workers")
            flags = flags + ["--workers", ",".join(addrs)]
            g = Gen(args.shoal, tmp, "cluster", MODEL, [], [], flags + ["--control", "off"])
            result("the coordinator command runs, reusing the cache (no second notice)",
                   g.rc == 0 and "converting" not in g.err and len(os.listdir(cache)) == 1,
                   detail(g))
            lines = [executor_line(g.err, a) for a in addrs]
            reqs = [int(m.group(3)) if m else None for m in lines]
            # any two of the workers hold every expert, and placement may
            # favour one holder: at least two of them serve
            result("the workers served requests (--stats)",
                   None not in reqs and sum(r > 0 for r in reqs) >= 2,
                   "%s\n%s" % (reqs, g.err[-800:]))
            local = re.search(r"executor 0 local: \S+, \d+ experts, (\d+) requests", g.err)
            result("the coordinator's own store served none (--local-experts off)",
                   local is None or local.group(1) == "0", g.err[-400:])
            # issue 32 item 8: not five lines of zeros for a store that ran nothing
            store = [l for l in g.err.splitlines() if l.startswith("shoal: experts:")]
            result("--stats: the idle local store is one line saying so, not lines of zeros",
                   len(store) == 1 and "no experts" in store[0], "\n".join(store))
            result("text, ids and logits equal the in-process run bit for bit",
                   same(g, base) and g.out == base.out, detail(g))
            # a worker killed mid-run: its experts go to their other holder
            rc, out, err, lg, idt, victim, before = killed_run(args, tmp, flags, ws)
            result("a worker killed mid-run: exit 0, text, ids and logits equal the in-process "
                   "run", rc == 0 and lg == base.logits and idt == base.ids and out == base.out,
                   "rc=%d, %d bytes printed before the kill; stderr: %s" %
                   (rc, before, err.strip()[-600:]))
            m = executor_line(err, victim.addr)
            result("a worker killed mid-run: it is reported down",
                   m is not None and m.group(1) == "down" and before < len(out),
                   "%d of %d bytes before the kill: %s" % (before, len(out),
                                                          m.group(0) if m else err[-400:]))
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
