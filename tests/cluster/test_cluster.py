#!/usr/bin/env python3
"""The coordinator's side of a cluster (issue 5; DESIGN contracts 1 and 3),
with real processes on loopback.

Converts the bundled model into a container, shards it with `shoal shard`
(3 workers, disjoint; 3 workers, 2 replicas) and checks:
- placement never changes results: the logits bytes (--logits-out), the
  token ids and the text are identical in-process, with 1 worker
  (--local-experts off), 3 disjoint shards, 3 shards with 2 replicas, and
  replicas plus the local store;
- kill -9 of a worker during decode (the coordinator is paused with SIGSTOP
  around the kill so the kill lands mid-decode): output identical to the
  undisturbed run, the worker is reported down;
- a worker that stops answering (SIGSTOP) mid-decode: its request times out
  after --request-timeout and is re-run elsewhere, output identical;
- clear one-line errors naming the peer, within the deadline (measured): a
  worker that never completes the handshake (a socket that accepts and stays
  silent), a worker on another container (fingerprint; with the local store
  on too, unless --local-fallback), a wrong or missing cluster key, shards
  that leave an expert without a holder;
- a non-loopback listener without a key: exit 2, one line;
- a coordinator restart: the workers stay up and serve the next run;
- workers that join (--accept-workers / shoal-worker --join);
- `shoal status` (table and --json) against a `shoal chat` whose stdin the
  test keeps open: one row per executor with its state and counters; and
  against a `shoal serve` decoding three requests per step: a decode rate
  above 0 (it counted single-token steps only), each figure's window named.

Usage: /usr/bin/python3 tests/cluster/test_cluster.py --shoal BIN --worker BIN
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import clusterlib as L  # noqa: E402
from clusterlib import (MODEL, env, kill_all, read_until, free_port, same,  # noqa: E402,F401
                        detail, workers_flag, stop_workers)
import harness as H  # noqa: E402  (tests/, on the path through clusterlib)

PROMPT = "ROMEO:\nBut soft, what light through yonder window breaks?\nJULIET:\n"
GEN = ["--max-tokens", "40", "--seed", "7", "--temp", "0.8", "--ignore-eos"]
procs = L.procs                          # every process started, for kill_all()
sanitizer_reports = L.sanitizer_reports  # coordinator runs with an ASan/UBSan report


result = H.Results()


def start_workers(args, tmp, name, models, *flags):
    return L.start_workers(args.worker, tmp, name, models, *flags)


def Gen(args, tmp, name, model, flags, gen=GEN, timeout=180):
    """One `shoal run` of PROMPT (clusterlib.Gen)."""
    return L.Gen(args.shoal, tmp, name, model, ["--prompt", PROMPT], gen, flags, timeout)


# ------------------------------------------------------------ contract 1

def identical_everywhere(args, tmp, base):
    ct, sh1, sh2 = args.ct, args.sh1, args.sh2
    ws = start_workers(args, tmp, "full", [ct])
    try:
        g = Gen(args, tmp, "one", ct, workers_flag(ws) + ["--local-experts", "off",
                                                          "--control", "off"])
        result("1 worker (--local-experts off): logits, ids and text identical",
               same(g, base), detail(g))
    finally:
        stop_workers(ws)
    ws = start_workers(args, tmp, "disjoint", [os.path.join(sh1, "worker-%d" % i)
                                               for i in range(3)])
    try:
        g = Gen(args, tmp, "disjoint", ct, workers_flag(ws) + ["--local-experts", "off",
                                                               "--control", "off", "--stats"])
        result("3 workers, disjoint shards: identical", same(g, base), detail(g))
        used = re.findall(r"executor \d+ (\S+): up, \d+ experts, (\d+) requests", g.err)
        result("3 workers, disjoint shards: every worker served requests",
               len(used) == 3 and all(int(n) > 0 for _, n in used), str(used))
    finally:
        stop_workers(ws)
    ws = start_workers(args, tmp, "replicas", [os.path.join(sh2, "worker-%d" % i)
                                               for i in range(3)])
    try:
        g = Gen(args, tmp, "replicas", ct, workers_flag(ws) + ["--local-experts", "off",
                                                               "--control", "off"])
        result("3 workers, 2 replicas each: identical", same(g, base), detail(g))
        g = Gen(args, tmp, "replicas_local", ct, workers_flag(ws) + ["--control", "off",
                                                                     "--stats"])
        result("3 workers, 2 replicas, plus the local store: identical", same(g, base),
               detail(g))
        local = re.search(r"executor 0 local: up, \d+ experts, (\d+) requests", g.err)
        result("local store is one more executor and got work",
               local is not None and int(local.group(1)) > 0, local.group(0) if local else g.err)
        # a coordinator restart: the same workers serve the next run
        g2 = Gen(args, tmp, "restart", ct, workers_flag(ws) + ["--local-experts", "off",
                                                               "--control", "off"])
        result("coordinator restart: workers stayed up and serve the next run",
               same(g2, base) and all(w.alive() for w in ws), detail(g2))
    finally:
        stop_workers(ws)


def failover(args, tmp, name, how, extra=()):
    """Run with 3 replicas-2 workers; once decode has started, pause the
    coordinator, kill -9 (how='kill') or SIGSTOP (how='stop') worker 1, resume
    it. Compare with the undisturbed run (in-process)."""
    gen = ["--max-tokens", "200", "--seed", "11", "--temp", "0.9", "--ignore-eos"]
    base = Gen(args, tmp, name + "_base", args.ct, [], gen=gen)
    ws = start_workers(args, tmp, name, [os.path.join(args.sh2, "worker-%d" % i)
                                         for i in range(3)])
    logits = os.path.join(tmp, name + ".npy")
    ids = os.path.join(tmp, name + ".ids")
    try:
        control = "127.0.0.1:%d" % free_port()
        cmd = [args.shoal, "run", "--model", args.ct, "--prompt", PROMPT, "--logits-out",
               logits, "--ids-out", ids, "--local-experts", "off", "--control", control,
               "--threads", "1"] + gen + workers_flag(ws) + list(extra)
        errf = open(os.path.join(tmp, name + ".err"), "w+")
        t0 = time.time()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errf, env=env())
        procs.append(p)
        # the prompt is echoed first; wait for some generated text after it
        head = read_until(p, re.escape(PROMPT.encode()) + rb"[\s\S]{12}", 120)
        # the victim is the worker placement has used most so far: with
        # replicas, every expert has another holder, and placement may well
        # never send a lightly used worker anything again (its stable homes
        # are few), so stopping that one would test nothing
        st = L.status_json(args.shoal, control)
        used = {e["address"]: e["requests"] for e in (st or {}).get("executors", [])}
        victim = max(ws, key=lambda w: used.get(w.addr, 0))
        os.kill(p.pid, signal.SIGSTOP)
        if how == "kill":
            victim.p.kill()
            victim.p.wait()
        else:
            os.kill(victim.p.pid, signal.SIGSTOP)
        os.kill(p.pid, signal.SIGCONT)
        fd = p.stdout.fileno()
        os.set_blocking(fd, True)
        rest = b""
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            rest += chunk
        rc = p.wait(timeout=180)
        seconds = time.time() - t0
        errf.seek(0)
        err = errf.read()
        errf.close()
        out = (head + rest).decode("utf-8", "replace")
        with open(logits, "rb") as f:
            lg = f.read()
        with open(ids) as f:
            idt = f.read()
        ok = rc == 0 and lg == base.logits and idt == base.ids and out == base.out
        result("%s mid-decode: output identical to the undisturbed run" % how, ok,
               "rc=%d %.1fs, %d bytes printed before the %s; stderr: %s" %
               (rc, seconds, len(head), how, err.strip()[-600:]))
        result("%s mid-decode: the worker is reported down" % how,
               victim.addr in err and "down" in err, err.strip()[-400:])
        return err, seconds
    finally:
        stop_workers(ws)


def holder_lost(args, tmp):
    """Disjoint shards, local store off: kill -9 a worker mid-decode. Its
    experts have no other holder, so generation fails with an error naming
    the layer, the expert and the dead peer -- never a hang, never a wrong
    answer."""
    gen = ["--max-tokens", "200", "--seed", "11", "--temp", "0.9", "--ignore-eos"]
    ws = start_workers(args, tmp, "lost", [os.path.join(args.sh1, "worker-%d" % i)
                                           for i in range(3)])
    try:
        # a request deadline far past the watchdog below: failing on the
        # dead peer's closed connection is then told apart from failing on
        # the deadline without timing the run (it may be slow on a busy box)
        cmd = [args.shoal, "run", "--model", args.ct, "--prompt", PROMPT, "--local-experts",
               "off", "--control", "off", "--threads", "1", "--request-timeout", "600"] + \
            gen + workers_flag(ws)
        errf = open(os.path.join(tmp, "lost.err"), "w+")
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errf, env=env())
        procs.append(p)
        read_until(p, re.escape(PROMPT.encode()) + rb"[\s\S]{12}", 120)
        os.kill(p.pid, signal.SIGSTOP)
        ws[1].p.kill()
        ws[1].p.wait()
        t0 = time.time()
        watchdog = threading.Timer(120, p.kill)
        watchdog.start()
        os.kill(p.pid, signal.SIGCONT)
        p.stdout.read()
        rc = p.wait()
        watchdog.cancel()
        seconds = time.time() - t0
        errf.seek(0)
        err = errf.read()
        errf.close()
        m = re.search(r"layer \d+ expert \d+: no holder left \(down: ([^ ]+) ", err)
        result("holder lost mid-decode: error names layer, expert and the dead peer, exit 1",
               rc == 1 and m is not None and m.group(1) == ws[1].addr, "rc=%d: %s" %
               (rc, err.strip()[-500:]))
        result("holder lost mid-decode: fails on the closed connection, not the 600 s request "
               "deadline (watchdog 120 s)", rc != -signal.SIGKILL, "%.2f s" % seconds)
    finally:
        stop_workers(ws)


# ------------------------------------------------------------ errors

def one_error_line(err):
    lines = [l for l in err.strip().splitlines() if l.startswith("shoal: ") and
             ("error" in l or "no holder" in l or "refused" in l or "failed" in l)]
    return lines


def silent_worker(args, tmp):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    addr = "127.0.0.1:%d" % srv.getsockname()[1]
    held = []
    try:
        def accept():
            while True:
                try:
                    c, _ = srv.accept()
                except OSError:
                    return
                held.append(c)   # accept and stay silent
        threading.Thread(target=accept, daemon=True).start()
        g = Gen(args, tmp, "silent", args.ct, ["--workers", addr, "--local-experts", "off",
                                               "--control", "off", "--connect-timeout", "2"])
        ok = (g.rc == 1 and addr in g.err and "handshake did not complete" in g.err and
              "no holder" in g.err)
        result("silent worker: error names it and the handshake, exit 1", ok, detail(g))
        result("silent worker: the error gives the 2 s --connect-timeout; no hang (watchdog 60 s)",
               re.search(r"(after|within) 2\.0 s", g.err) is not None and g.seconds < 60,
               "%.2f s" % g.seconds)
    finally:
        srv.close()
        for c in held:
            c.close()


def wrong_fingerprint(args, tmp):
    ws = start_workers(args, tmp, "otherct", [args.other])
    try:
        g = Gen(args, tmp, "fingerprint", args.ct, workers_flag(ws) + [
            "--local-experts", "off", "--control", "off", "--connect-timeout", "3"])
        ok = g.rc == 1 and ws[0].addr in g.err and "fingerprint" in g.err
        result("worker on another container: error names it and the fingerprint", ok,
               detail(g))
        result("fingerprint mismatch reported, no hang (watchdog 60 s)", g.seconds < 60,
               "%.2f s" % g.seconds)
        # with the local store on, the run fails all the same (no worker is up)
        # unless --local-fallback: then it goes on without it and says why
        g = Gen(args, tmp, "fingerprint_local", args.ct, workers_flag(ws) + [
            "--control", "off", "--connect-timeout", "3"])
        result("worker on another container, local store on: no worker up, exit 1",
               g.rc == 1 and ws[0].addr in g.err and "fingerprint" in g.err and
               "--local-fallback" in g.err, detail(g))
        g = Gen(args, tmp, "fingerprint_fallback", args.ct, workers_flag(ws) + [
            "--control", "off", "--connect-timeout", "3", "--local-fallback"])
        result("worker on another container, --local-fallback: reported, run completes",
               g.rc == 0 and ws[0].addr in g.err and "fingerprint" in g.err, detail(g))
    finally:
        stop_workers(ws)


def wrong_key(args, tmp):
    key = os.path.join(tmp, "cluster.key")
    other = os.path.join(tmp, "other.key")
    with open(key, "w") as f:
        f.write("c2hvYWwtdGVzdC1jbHVzdGVyLWtleS0wMTIzNDU2Nzg5\n")
    with open(other, "w") as f:
        f.write("YW5vdGhlci1rZXktbm90LXRoZS1jbHVzdGVyLW9uZQ==\n")
    os.chmod(key, 0o600)
    os.chmod(other, 0o600)
    ws = start_workers(args, tmp, "keyed", [args.ct], "--cluster-key", key)
    try:
        base_flags = workers_flag(ws) + ["--local-experts", "off", "--control", "off",
                                         "--connect-timeout", "3"]
        g = Gen(args, tmp, "wrongkey", args.ct, base_flags + ["--cluster-key", other])
        result("wrong cluster key: error names the worker and authentication",
               g.rc == 1 and ws[0].addr in g.err and "authentication" in g.err, detail(g))
        result("wrong key reported, no hang (watchdog 60 s)", g.seconds < 60, "%.2f s" % g.seconds)
        g = Gen(args, tmp, "nokey", args.ct, base_flags)
        result("no cluster key against a keyed worker: refused, names the worker",
               g.rc == 1 and ws[0].addr in g.err and "key" in g.err, detail(g))
        g = Gen(args, tmp, "rightkey", args.ct, base_flags + ["--cluster-key", key])
        result("right cluster key: identical output", same(g, args.base), detail(g))
    finally:
        stop_workers(ws)


def missing_holder(args, tmp):
    # worker-2 of the disjoint shards is not running: its port refuses
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    dead = "127.0.0.1:%d" % free.getsockname()[1]
    free.close()
    ws = start_workers(args, tmp, "partial", [os.path.join(args.sh1, "worker-%d" % i)
                                              for i in range(2)])
    try:
        g = Gen(args, tmp, "missing", args.ct, ["--workers", ",".join(
            [ws[0].addr, ws[1].addr, dead]), "--local-experts", "off", "--control", "off",
            "--connect-timeout", "2"])
        m = re.search(r"layer (\d+) expert (\d+) has no holder", g.err)
        ok = g.rc == 1 and m is not None and dead in g.err and "refused" in g.err
        result("expert without a holder: error names layer, expert and the down peer", ok,
               detail(g))
        result("expert without a holder: reported, no hang (watchdog 60 s)",
               g.seconds < 60, "%.2f s" % g.seconds)
    finally:
        stop_workers(ws)


def loopback_only(args, tmp):
    r = subprocess.run([args.shoal, "run", "--model", args.ct, "--prompt", "x",
                        "--accept-workers", "0.0.0.0:0"], capture_output=True, text=True,
                       timeout=60, env=env())
    lines = r.stderr.strip().splitlines()
    result("non-loopback --accept-workers without a key: exit 2, one line",
           r.returncode == 2 and len(lines) == 1 and "loopback" in lines[0], r.stderr.strip())
    e = env()
    e["XDG_CACHE_HOME"] = os.path.join(tmp, "xdg-cache")
    r = subprocess.run([args.shoal, "run", "--model", MODEL, "--prompt", "x", "--workers",
                        "127.0.0.1:1", "--control", "off", "--connect-timeout", "1",
                        "--max-tokens", "1", "--local-fallback"],
                       capture_output=True, text=True, timeout=60, env=e)
    cached = os.listdir(os.path.join(e["XDG_CACHE_HOME"], "shoal"))
    result("--workers with a Hugging Face directory: converted once into the cache "
           "with a notice (then the down worker is reported and, with --local-fallback, "
           "local experts run)",
           r.returncode == 0 and "converting" in r.stderr and "127.0.0.1:1" in r.stderr
           and len(cached) == 1 and cached[0].endswith(".shoal"), r.stderr.strip())


# ------------------------------------------------------------ joining, status

def joining(args, tmp):
    addr = "127.0.0.1:%d" % free_port()
    # the worker starts first and keeps dialling until the coordinator is up
    ws = start_workers(args, tmp, "joiner", [args.ct], "--join", addr, "--name", "joiner-0")
    try:
        g = Gen(args, tmp, "joined", args.ct, ["--accept-workers", addr, "--local-experts",
                                               "off", "--control", "off",
                                               "--connect-timeout", "20", "--stats"])
        result("a worker that joins serves the run: identical",
               same(g, args.base) and re.search(r"joiner-0: up, 32 experts, [1-9]", g.err)
               is not None, detail(g))
        g = Gen(args, tmp, "joined2", args.ct, ["--accept-workers", addr, "--local-experts",
                                                "off", "--control", "off",
                                                "--connect-timeout", "20"])
        result("the joiner re-dials the next coordinator: identical", same(g, args.base),
               detail(g))
        # idle for 8 s, its re-dials have backed off: they stay within 2 s of
        # each other, so a coordinator's 5 s start window finds it (with a
        # 10 s cap the dials came at 7.5 and 15.5 s: a start at 8 s missed it)
        time.sleep(8)
        g = Gen(args, tmp, "joined3", args.ct, ["--accept-workers", addr, "--local-experts",
                                                "off", "--control", "off",
                                                "--connect-timeout", "5"])
        result("an idle joiner (8 s) reaches a coordinator within its 5 s start: identical",
               same(g, args.base), detail(g))
    finally:
        stop_workers(ws)


def query_status(args, addr, *flags):
    return L.query_status(args.shoal, addr, *flags)


def status(args, tmp):
    ws = start_workers(args, tmp, "status", [os.path.join(args.sh2, "worker-%d" % i)
                                             for i in range(3)])
    errp = os.path.join(tmp, "chat.err")
    errf = open(errp, "w")
    chat = None
    try:
        chat = subprocess.Popen([args.shoal, "chat", "--model", args.ct, "--control",
                                 "127.0.0.1:0", "--max-tokens", "16", "--seed", "3"] +
                                workers_flag(ws), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=errf, env=env())
        procs.append(chat)
        addr = None
        t0 = time.time()
        while time.time() - t0 < 60 and not addr:
            with open(errp) as f:
                m = re.search(r"control (127\.0\.0\.1:\d+)", f.read())
            addr = m.group(1) if m else None
            time.sleep(0.05)
        result("chat prints its control address", addr is not None)
        if not addr:
            return
        chat.stdin.write(b"Good morrow, cousin.\n")
        chat.stdin.flush()
        rows = None
        t0 = time.time()
        while time.time() - t0 < 60:
            rc, out, err = query_status(args, addr, "--json")
            if rc == 0:
                st = json.loads(out)
                rows = st["executors"]
                if sum(e["requests"] for e in rows) > 0 and st["tokens"] > 0:
                    break
            time.sleep(0.3)
        ok = rows is not None and len(rows) == 4 and rows[0]["address"] == "local" and \
            [e["address"] for e in rows[1:]] == [w.addr for w in ws] and \
            all(e["state"] == "up" for e in rows) and \
            all(0 < e["experts_held"] < e["experts_total"] for e in rows[1:]) and \
            sum(e["requests"] for e in rows) > 0
        result("status --json: one row per executor, all up, shard coverage, requests",
               ok, json.dumps(rows)[:900] if rows else "no reply")
        if rows:
            result("status --json: per-token split and RTT present",
                   st["seconds_per_token"]["attention"] > 0 and
                   st["seconds_per_token"]["expert_wait"] > 0 and
                   all(e["rtt_ms"] > 0 for e in rows[1:]),
                   json.dumps(st["seconds_per_token"]))
        rc, out, err = query_status(args, addr)
        ok = rc == 0 and all(w.addr in out for w in ws) and "local" in out and \
            "per token:" in out and out.count(" up ") >= 4
        result("status table: rows and totals", ok, out + err)
        # a worker goes away: its row says down, with why
        ws[2].p.kill()
        ws[2].p.wait()
        t0 = time.time()
        down = False
        while time.time() - t0 < 20 and not down:
            rc, out, err = query_status(args, addr, "--json")
            if rc == 0:
                r = [e for e in json.loads(out)["executors"] if e["address"] == ws[2].addr]
                down = bool(r) and r[0]["state"] == "down" and r[0]["last_error"] != ""
            time.sleep(0.3)
        result("status: a killed worker shows down with its last error", down, out[:600])
        # the watch mode refreshes until interrupted
        wp = subprocess.Popen([args.shoal, "status", "--control", addr, "--watch", "0.2"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env())
        procs.append(wp)
        time.sleep(1.5)
        wp.send_signal(signal.SIGINT)
        wout, _ = wp.communicate(timeout=10)
        result("status --watch refreshes until Ctrl-C",
               wp.returncode == 0 and wout.decode().count("per token:") >= 3,
               "rc=%s, %d refreshes" % (wp.returncode, wout.decode().count("per token:")))
        chat.stdin.close()
        crc = chat.wait(timeout=60)
        result("chat exits 0 at end of input", crc == 0, "rc=%s" % crc)
    finally:
        if chat and chat.poll() is None:
            chat.kill()
        errf.close()
        stop_workers(ws)
    rc, out, err = query_status(args, addr or "127.0.0.1:1")
    result("status without a coordinator: one-line error, exit 1",
           rc == 1 and len(err.strip().splitlines()) == 1 and "cannot reach" in err,
           err.strip())


def status_batched(args, tmp):
    """Issue 32 item 8: `shoal status` showed 0.00 tok/s while `shoal serve`
    decoded several requests per step (only single-token steps counted).
    Three requests start together on a serve with one worker; while they
    stream, status's decode rate is above 0, and the table's first line
    says which window each figure covers."""
    ws = start_workers(args, tmp, "sbatch", [args.ct])
    srv = None
    try:
        control = "127.0.0.1:%d" % free_port()
        # a pause after each step keeps the requests streaming while status asks
        srv = H.Server(args.shoal, "--workers", ws[0].addr, "--local-experts", "off",
                       "--control", control, "--test-token-delay", "20", model=args.ct)
        go = threading.Barrier(3)
        done = []

        def one():
            go.wait()
            done.append(srv.post("/v1/completions", {"prompt": "ROMEO:",
                                                     "max_tokens": 150})[0])
        ts = [threading.Thread(target=one) for _ in range(3)]
        for t in ts:
            t.start()
        st = None
        t0 = time.time()
        while time.time() - t0 < 60 and len(done) < 3:
            st = L.status_json(args.shoal, control)
            if st and st["tokens"] > 60:
                break
            time.sleep(0.1)
        rc, table, _ = L.query_status(args.shoal, control)
        for t in ts:
            t.join(timeout=120)
        result("status while serve decodes 3 requests a step: decode tok/s above 0",
               st is not None and st["tok_per_s"] > 0,
               "status %s; %d requests answered by the end" %
               (json.dumps({k: st[k] for k in ("tokens", "tok_per_s")}) if st else None,
                len(done)))
        first = table.splitlines()[0] if table else ""
        result("status: the first line labels its windows (tokens evaluated, decode tok/s "
               "over the last steps)", rc == 0 and "tokens evaluated" in first and
               re.search(r"decode [\d.]+ tok/s \(last \d+ steps\)", first) is not None, first)
        result("the 3 requests succeed", done == [200, 200, 200], str(done))
    finally:
        if srv:
            srv.stop()
        stop_workers(ws)


# ------------------------------------------------------------ main

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="shoal-cluster-")
    try:
        args.ct = os.path.join(tmp, "ct")
        args.other = os.path.join(tmp, "ct-int8")
        args.sh1 = os.path.join(tmp, "sh1")
        args.sh2 = os.path.join(tmp, "sh2")
        for cmd in ([args.shoal, "convert", MODEL, args.ct],
                    [args.shoal, "convert", MODEL, args.other, "--experts", "int8"],
                    [args.shoal, "shard", "--model", args.ct, "--shards", "3", "--out",
                     args.sh1],
                    [args.shoal, "shard", "--model", args.ct, "--shards", "3", "--replicas",
                     "2", "--out", args.sh2]):
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env())
            if r.returncode != 0:
                print("FAIL setup: %s\n%s" % (" ".join(cmd), r.stderr))
                return 1
        args.base = Gen(args, tmp, "base", args.ct, [])
        result("in-process baseline runs", args.base.rc == 0 and args.base.logits,
               detail(args.base))
        for fn in (identical_everywhere,):
            fn(args, tmp, args.base)
        failover(args, tmp, "kill", "kill")
        err, secs = failover(args, tmp, "stop", "stop", ["--request-timeout", "2"])
        result("stopped worker: its request timed out and moved",
               "timed out" in err or "no heartbeat" in err, err.strip()[-300:])
        for fn in (holder_lost, silent_worker, wrong_fingerprint, wrong_key, missing_holder, loopback_only,
                   joining, status, status_batched):
            try:
                fn(args, tmp)
            except Exception as e:   # a broken scenario must not hide the others
                result(fn.__name__, False, "exception: %r" % e)
                kill_all()
        result("no sanitizer report from any coordinator run", not sanitizer_reports,
               ", ".join(sanitizer_reports))
    finally:
        kill_all()
        if args.keep:
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return result.summary()


if __name__ == "__main__":
    sys.exit(main())
