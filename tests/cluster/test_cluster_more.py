#!/usr/bin/env python3
"""More of issue 5's multi-process cluster tests (DESIGN contracts 1 and 3),
beyond test_cluster.py:

1. families: for every family's tiny model (tests/reference/gen_tiny.py:
   mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v2, deepseek_v3, kimi_k2,
   glm4_moe, gpt_oss; bf16 containers, deepseek_v3_fp8 as an FP8 container,
   gpt_oss_mxfp4 as an MXFP4 one (its experts kept as shipped), and
   qwen3_moe with int4 experts and deepseek_v3 with int4a8 ones too), a 20-id prompt (multi-row prefill requests) and
   greedy decode: logits bytes and ids identical in-process, with 1 worker
   (--local-experts off), 3 workers on disjoint shards and 3 workers with 2
   replicas each (`shoal shard`);
2. netlab: the bundled model with its 3 workers in network namespaces, each
   on its own 10.B.N.2 address behind a tbf-limited veth (200mbit, 1gbit,
   1gbit), with a cluster key: identical to in-process (root only; skipped
   with the reason otherwise);
3. restart: `shoal chat` (stdin held open) on 3 workers with 2 replicas;
   kill -9 of a worker during decode, `shoal status --json` shows it down,
   it restarts on the same port after 4 s and its row is up again within
   the redial backoff; a second worker is killed between turns so that the
   restarted one is the only holder of some experts, and it serves the
   next turn; the whole conversation is identical to the in-process one;
4. coordinator restart: kill -9 of the coordinator mid-decode; the workers
   stay up, the next two sessions' outputs are identical, and the workers
   exit 0 on SIGTERM;
5. soak: 4 workers (a 4-way shard, 2 replicas) x 1000 decode steps of a
   tiny model with a 1100-token context, under a watchdog that fails the
   test (and kills everything) when the token stream and the status
   counter stall; ids, logits and text identical to in-process; and the
   watchdog itself fires when the workers are stopped mid-run.

Every process is killed in finally blocks (SIGTERM included); the
namespaces are removed by netlab even on failure.

Usage: /usr/bin/python3 tests/cluster/test_cluster_more.py --shoal BIN --worker BIN
       [--only families,netlab,restart,coordinator,soak] [--keep]
"""
import argparse
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import clusterlib as L  # noqa: E402
from clusterlib import Gen, same, detail  # noqa: E402

REFERENCE = os.path.join(L.ROOT, "tests", "reference")
FAMILIES = ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v2", "deepseek_v3",
            "kimi_k2", "glm4_moe", "deepseek_v3_fp8", "gpt_oss", "gpt_oss_mxfp4"]
# 20 ids < the tiny models' 320-token vocabulary: prefill sends 20-row requests
TOKENS = ["--tokens", "17,300,3,101,257,42,7,55,199,260,12,88,150,231,9,64,280,33,120,5"]
TGEN = ["--max-tokens", "8", "--greedy", "--ignore-eos"]
PROMPT = ["--prompt", "ROMEO:\nBut soft, what light through yonder window breaks?\nJULIET:\n"]
GEN = ["--max-tokens", "40", "--seed", "7", "--temp", "0.8", "--ignore-eos"]
QUIET = ["--local-experts", "off", "--control", "off"]
WTHREADS = ["--threads", "1"]
SOAK_STEPS = 1000
WATCHDOG_S = 20          # no token and no status progress for this long: deadlock
KEY = "c2hvYWwtdGVzdC1jbHVzdGVyLWtleS0wMTIzNDU2Nzg5\n"

check = L.Results()


def setup(cmd):
    r = L.run(cmd)
    if r.returncode != 0:
        raise RuntimeError("setup failed: %s\n%s" % (" ".join(cmd), r.stderr.strip()[-800:]))
    return r


def shard(args, ct, out, n, replicas=1):
    setup([args.shoal, "shard", "--model", ct, "--shards", str(n), "--replicas",
           str(replicas), "--out", out])
    return [os.path.join(out, "worker-%d" % i) for i in range(n)]


def placements(args, tmp, name, ct, prompt, gen, base, stats_check=True):
    """Run ct on 1 worker, 3 disjoint shards and 3 shards x 2 replicas
    (local store off); each must equal base byte for byte."""
    d = os.path.join(tmp, name + "-sh1")
    r = os.path.join(tmp, name + "-sh2")
    layouts = [("1 worker", [ct]), ("3 workers, disjoint", shard(args, ct, d, 3)),
               ("3 workers, 2 replicas", shard(args, ct, r, 3, 2))]
    for i, (what, models) in enumerate(layouts):
        ws = L.start_workers(args.worker, tmp, "%s-%d" % (name, i), models, *WTHREADS)
        try:
            g = Gen(args.shoal, tmp, "%s-%d" % (name, i), ct, prompt, gen,
                    L.workers_flag(ws) + QUIET + ["--stats"])
            check("%s, %s: logits bytes, ids and text identical to in-process" % (name, what),
                  same(g, base), detail(g))
            if stats_check and "disjoint" in what:
                # every worker is the only holder of its share: each must
                # have been asked for some (with replicas, placement may
                # legitimately keep a worker idle: it prefers warm holders)
                used = [int(x) for x in re.findall(
                    r"executor \d+ \S+: up, \d+ experts, (\d+) requests", g.err)]
                check("%s, %s: every worker served requests" % (name, what),
                      len(used) == len(ws) and all(n > 0 for n in used), str(used))
        finally:
            L.stop_workers(ws)


# ------------------------------------------------------------ 1. families

def families(args, tmp):
    hf = os.path.join(tmp, "hf")
    setup(["/usr/bin/python3", os.path.join(REFERENCE, "gen_tiny.py"), hf, "--only",
           ",".join(FAMILIES)])
    models = [(fam, os.path.join(hf, fam), []) for fam in FAMILIES]
    models.append(("qwen3_moe-int4", os.path.join(hf, "qwen3_moe"),
                   ["--experts", "int4", "--dense", "int8", "--group", "32"]))
    models.append(("gpt_oss-int4a8", os.path.join(hf, "gpt_oss"),
                   ["--experts", "int4a8", "--dense", "int8", "--group", "32"]))
    models.append(("deepseek_v3-int4a8", os.path.join(hf, "deepseek_v3"),
                   ["--experts", "int4a8", "--dense", "int4a8", "--group", "32", "--kv", "f16"]))
    for name, src, conv in models:
        ct = os.path.join(tmp, "ct-" + name)
        setup([args.shoal, "convert", src, ct] + conv)
        base = Gen(args.shoal, tmp, name + "-base", ct, TOKENS, TGEN)
        if not check("%s: in-process baseline" % name, base.rc == 0 and base.logits,
                     detail(base)):
            continue
        placements(args, tmp, name, ct, TOKENS, TGEN, base)


# ------------------------------------------------------------ 2. netlab

def netlab(args, tmp):
    import netlab as N
    ok, why = N.Lab.available()
    if not ok:
        check.skip("netlab: workers in network namespaces", why)
        return
    key = os.path.join(tmp, "cluster.key")
    with open(key, "w") as f:
        f.write(KEY)
    os.chmod(key, 0o600)
    ct = args.ct
    base = args.base
    layouts = [("disjoint", shard(args, ct, os.path.join(tmp, "ns-sh1"), 3)),
               ("replicas", shard(args, ct, os.path.join(tmp, "ns-sh2"), 3, 2))]
    rates = ["200mbit", "1gbit", "1gbit"]
    with N.Lab() as lab:
        hosts = [lab.add_host("w%d" % i, rate=rate) for i, rate in enumerate(rates)]
        for what, models in layouts:
            ws = []
            try:
                for i, (h, m) in enumerate(zip(hosts, models)):
                    launch = (lambda h: lambda argv, **kw: h.popen(argv, **kw))(h)
                    ws.append(L.Worker(args.worker, tmp, "ns-%s-%d" % (what, i), m,
                                       "--cluster-key", key, *WTHREADS,
                                       listen=h.addr + ":7070", launch=launch))
                up = [w.wait_ready() for w in ws]
                if not check("netlab %s: 3 workers listen on 10.B.N.2 with a key" % what,
                             up == [h.addr + ":7070" for h in hosts],
                             "%s; %s" % (up, [w.text()[-300:] for w in ws if not w.addr])):
                    continue
                g = Gen(args.shoal, tmp, "ns-" + what, ct, PROMPT, GEN,
                        L.workers_flag(ws) + ["--cluster-key", key] + QUIET + ["--stats"])
                check("netlab %s (links %s): logits bytes, ids and text identical to "
                      "in-process" % (what, "/".join(rates)), same(g, base), detail(g))
                used = re.findall(
                    r"executor \d+ (10\.\d+\.\d+\.2:7070): up, \d+ experts, (\d+) requests", g.err)
                if what == "disjoint":   # replicas: placement may keep one idle
                    check("netlab %s: each namespaced worker served requests" % what,
                          len(used) == 3 and all(int(n) > 0 for _, n in used), str(used))
                # without the key the non-loopback peers are refused
                g = Gen(args.shoal, tmp, "ns-nokey", ct, PROMPT, ["--max-tokens", "2"],
                        L.workers_flag(ws[:1]) + QUIET + ["--connect-timeout", "3"])
                check("netlab %s: no key against keyed workers: exit 1, names the worker"
                      % what, g.rc == 1 and ws[0].addr in g.err and "key" in g.err, detail(g))
            finally:
                L.stop_workers(ws)
        prefix = lab.prefix
    left = N.leftovers(prefix)
    check("netlab: namespaces and links removed", not left, str(left))


# ------------------------------------------------------------ 3. worker restart

def chat_cmd(args, ct, extra=()):
    return [args.shoal, "chat", "--model", ct, "--max-tokens", "48", "--seed", "3",
            "--temp", "0.8", "--ignore-eos"] + list(extra)


TURNS = [b"Good morrow, cousin.\n", b"What news from Verona?\n"]


def restart(args, tmp):
    ct = args.ct
    r = subprocess.run(chat_cmd(args, ct), input=b"".join(TURNS), capture_output=True,
                       timeout=120, env=L.env())
    if not check("chat in-process baseline", r.returncode == 0 and r.stdout, r.stderr[-300:]):
        return
    base_out = r.stdout
    models = [os.path.join(args.sh2, "worker-%d" % i) for i in range(3)]
    ws = L.start_workers(args.worker, tmp, "rs", models, *WTHREADS)
    errp = os.path.join(tmp, "rs-chat.err")
    errf = open(errp, "w")
    chat = None
    try:
        chat = subprocess.Popen(chat_cmd(args, ct, L.workers_flag(ws) + [
            "--local-experts", "off", "--control", "127.0.0.1:0"]), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=errf, env=L.env())
        L.procs.append(chat)
        addr = L.control_addr(errp, p=chat)
        if not check("restart: chat prints its control address", addr,
                     open(errp).read()[-300:]):
            return
        victim = ws[1]
        chat.stdin.write(TURNS[0])
        chat.stdin.flush()
        # past the piped message's '> ' line: into the reply
        head = L.read_until(chat, rb"> [^\n]*\n[\s\S]*?\S[\s\S]{11}", 60)
        # the coordinator is stopped around the kill so it lands mid-decode
        os.kill(chat.pid, signal.SIGSTOP)
        victim.kill9()
        os.kill(chat.pid, signal.SIGCONT)
        row, secs = L.poll(lambda: (lambda e: e if e and e["state"] == "down" else None)(
            L.executor(L.status_json(args.shoal, addr), victim.addr)), 20)
        check("restart: the killed worker's row is down with its last error",
              row and row["last_error"], json.dumps(row))
        # the worker stays away long enough for the redial backoff to grow
        # (0.25, 0.5, 1, 2 s ...), then comes back on the same port
        time.sleep(4.0)
        again = L.Worker(args.worker, tmp, "rs-1", models[1], *WTHREADS, listen=victim.addr)
        ws[1] = again
        check("restart: the worker restarts on the same port", again.wait_ready() == victim.addr,
              again.text()[-300:])
        # the redial backoff is at most 5 s (cluster_net.c BACKOFF_MAX_S);
        # not timed here (a busy machine stretches any figure): 60 s is a
        # watchdog against a worker never redialled
        row, secs = L.poll(lambda: (lambda e: e if e and e["state"] == "up" else None)(
            L.executor(L.status_json(args.shoal, addr), victim.addr)), 60, 0.1)
        check("restart: its row is up again (watchdog 60 s)",
              row, "%.2f s: %s" % (secs, json.dumps(row)))
        # the restarted worker must serve again: kill the other holder of
        # the most experts it shares (replicas 2 of 3: each expert has two
        # holders), so those experts have no one else
        pl = json.load(open(os.path.join(args.sh2, "placement.json")))
        pairs = [sorted(h) for layer in pl["experts"] for h in layer["holders"]]
        partner = max((0, 2), key=lambda o: pairs.count(sorted([1, o])))
        only = pairs.count(sorted([1, partner]))
        ws[partner].kill9()
        row, secs = L.poll(lambda: (lambda e: e if e and e["state"] == "down" else None)(
            L.executor(L.status_json(args.shoal, addr), ws[partner].addr)), 20)
        check("restart: a second worker killed between turns shows down", row, json.dumps(row))
        before = L.executor(L.status_json(args.shoal, addr), victim.addr)["requests"]
        chat.stdin.write(TURNS[1])
        chat.stdin.flush()
        seen = []

        def served():
            st = L.status_json(args.shoal, addr)
            seen.append(st)
            e = L.executor(st, victim.addr)
            return e if e and e["requests"] > before else None
        row, secs = L.poll(served, 60)
        check("restart: the restarted worker serves the next turn (sole holder of %d experts)"
              % only, row, "requests %s -> %s; last status: %s" %
              (before, row and row["requests"], json.dumps(seen[-1])))
        chat.stdin.close()
        out = head + L.read_rest(chat)
        rc = chat.wait(timeout=120)
        errf.flush()
        err = open(errp).read()
        check("restart: the whole conversation is identical to in-process",
              rc == 0 and out == base_out,
              "rc=%s %d vs %d bytes, %d before the kill; stderr: %s" %
              (rc, len(out), len(base_out), len(head), err.strip()[-500:]))
    finally:
        if chat and chat.poll() is None:
            chat.kill()
            chat.wait()
        errf.close()
        L.stop_workers(ws)


# ------------------------------------------------------------ 4. coordinator restart

def coordinator(args, tmp):
    """kill -9 of the coordinator mid-decode; the workers stay up and serve
    the next session, identical output."""
    ct = args.ct
    models = [os.path.join(args.sh2, "worker-%d" % i) for i in range(3)]
    ws = L.start_workers(args.worker, tmp, "cr", models, *WTHREADS)
    try:
        long_gen = ["--max-tokens", "200", "--seed", "7", "--temp", "0.8", "--ignore-eos"]
        cmd = [args.shoal, "run", "--model", ct] + PROMPT + long_gen + L.workers_flag(ws) + QUIET
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=L.env())
        L.procs.append(p)
        head = L.read_until(p, rb"JULIET:\n[\s\S]{12}", 60)
        p.kill()
        p.wait()
        time.sleep(0.5)
        check("coordinator kill -9 mid-decode: every worker stays up",
              len(head) > 0 and all(w.alive() for w in ws),
              "%d bytes before the kill; %s" % (len(head), [w.text()[-200:] for w in ws
                                                            if not w.alive()]))
        g = Gen(args.shoal, tmp, "cr-next", ct, PROMPT, GEN, L.workers_flag(ws) + QUIET)
        check("coordinator restart: the next session is identical", same(g, args.base),
              detail(g))
        g = Gen(args.shoal, tmp, "cr-next2", ct, PROMPT, GEN, L.workers_flag(ws) + QUIET)
        check("coordinator restart: and the one after", same(g, args.base) and
              all(w.alive() for w in ws), detail(g))
    finally:
        L.stop_workers(ws)
    codes = [w.p.returncode for w in ws]
    check("coordinator restart: workers exit 0 on SIGTERM", codes == [0, 0, 0], str(codes))


# ------------------------------------------------------------ 5. soak

def thread_states(pid):
    """'tid:state:wchan' of every thread of pid (deadlock diagnostics)."""
    out = []
    try:
        for t in sorted(os.listdir("/proc/%d/task" % pid)):
            try:
                stat = open("/proc/%d/task/%s/stat" % (pid, t)).read()
                state = stat[stat.rindex(")") + 2]
                wchan = open("/proc/%d/task/%s/wchan" % (pid, t)).read().strip()
                out.append("%s:%s:%s" % (t, state, wchan or "-"))
            except OSError:
                pass
    except OSError:
        return "gone"
    return " ".join(out)


def watch(args, p, addr, ws, watchdog_s, t0, hook=None):
    """Read p's stdout to EOF while watching for progress: new bytes on the
    token stream, or a larger `tokens` in `shoal status --json` (polled
    every 2 s). Returns (stdout bytes, None) at EOF, or (bytes so far, why)
    when neither moved for watchdog_s seconds. hook() runs once, after the
    first generated bytes."""
    fd = p.stdout.fileno()
    os.set_blocking(fd, False)
    out = b""
    tokens = 0
    last = last_status = time.time()
    while True:
        r, _, _ = select.select([fd], [], [], 0.5)
        if r:
            chunk = os.read(fd, 65536)
            if not chunk:
                return out, None
            out += chunk
            last = time.time()
            if hook:
                hook()
                hook = None
        now = time.time()
        if addr and now - last_status > 2.0:
            last_status = now
            st = L.status_json(args.shoal, addr)
            if st and st["tokens"] > tokens:
                tokens = st["tokens"]
                last = now
        if now - last > watchdog_s:
            return out, ("no token and no status progress for %d s after %d bytes, %d "
                         "tokens (%.0f s in); threads (tid:state:wchan): coordinator %s; "
                         "workers %s" % (watchdog_s, len(out), tokens, now - t0,
                                         thread_states(p.pid),
                                         " | ".join(thread_states(w.p.pid) for w in ws)))


def soak_run(args, tmp, name, ct, gen, ws, watchdog_s, extra=(), hook=None):
    """One `shoal run` on ws under the watchdog; returns (rc, stdout bytes,
    stderr, logits bytes, ids text, seconds, stall reason or None). Kills
    the coordinator on a stall."""
    logits = os.path.join(tmp, name + ".npy")
    ids = os.path.join(tmp, name + ".ids")
    errp = os.path.join(tmp, name + ".err")
    cmd = [args.shoal, "run", "--model", ct] + TOKENS + gen + [
        "--logits-out", logits, "--ids-out", ids, "--local-experts", "off",
        "--control", "127.0.0.1:0"] + L.workers_flag(ws) + list(extra)
    with open(errp, "w") as errf:
        t0 = time.time()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errf, env=L.env())
        L.procs.append(p)
        try:
            addr = L.control_addr(errp, p=p)
            out, stalled = watch(args, p, addr, ws, watchdog_s, t0, hook)
            rc = None if stalled else p.wait(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    secs = time.time() - t0
    idt = L.read_bytes(ids)
    return (rc, out, open(errp).read(), L.read_bytes(logits), idt.decode() if idt else None,
            secs, stalled)


def soak(args, tmp):
    hf = os.path.join(tmp, "hf-long")
    src = os.path.join(hf, "qwen3_moe")
    setup(["/usr/bin/python3", os.path.join(REFERENCE, "gen_tiny.py"), hf, "--only",
           "qwen3_moe"])
    # the same weights with a context long enough for 20 + 1000 tokens
    # (rope without scaling: the positions are computed, not stored)
    cfgp = os.path.join(src, "config.json")
    cfg = json.load(open(cfgp))
    cfg["max_position_embeddings"] = 1100
    json.dump(cfg, open(cfgp, "w"), indent=2)
    ct = os.path.join(tmp, "ct-long")
    setup([args.shoal, "convert", src, ct])
    gen = ["--max-tokens", str(SOAK_STEPS), "--seed", "5", "--temp", "1.0", "--ignore-eos"]
    base = Gen(args.shoal, tmp, "soak-base", ct, TOKENS, gen)
    if not check("soak: in-process baseline, %d tokens" % SOAK_STEPS,
                 base.rc == 0 and base.ids and len(base.ids.split()) == SOAK_STEPS,
                 detail(base)):
        return
    models = shard(args, ct, os.path.join(tmp, "soak-sh"), 4, 2)
    ws = L.start_workers(args.worker, tmp, "soak", models, *WTHREADS)
    try:
        rc, out, err, lg, idt, secs, stalled = soak_run(args, tmp, "soak", ct, gen, ws,
                                                        WATCHDOG_S)
        check("soak: 4 workers x %d decode steps, no deadlock (watchdog %d s)" %
              (SOAK_STEPS, WATCHDOG_S),
              not stalled and rc == 0 and "decode %d tokens" % SOAK_STEPS in err,
              stalled or "rc=%s %.1f s, stderr: %s" % (rc, secs, err.strip()[-400:]))
        check("soak: %d ids, logits bytes and text identical to in-process" % SOAK_STEPS,
              lg == base.logits and idt == base.ids and
              out.decode("utf-8", "replace") == base.out,
              "logits %s, ids %s, text %s" % (lg == base.logits, idt == base.ids,
                                               out.decode("utf-8", "replace") == base.out))
        check("soak: every worker alive after the run", all(w.alive() for w in ws))
        # the watchdog itself: with every worker stopped (SIGSTOP) and a long
        # request deadline the run stalls, and the watchdog must say so
        def stop_all():
            for w in ws:
                os.kill(w.p.pid, signal.SIGSTOP)
        try:
            rc, out, err, lg, idt, secs, stalled = soak_run(
                args, tmp, "soak-stall", ct, gen, ws, 3, ["--request-timeout", "120"],
                hook=stop_all)
        finally:
            for w in ws:
                os.kill(w.p.pid, signal.SIGCONT)
        check("soak: the watchdog reports a stall (workers stopped) before the 120 s request "
              "deadline", stalled is not None and secs < 120, "%.1f s: %s" % (
                  secs, stalled or err[-300:]))
    finally:
        L.stop_workers(ws)


# ------------------------------------------------------------ main

SECTIONS = [("families", families), ("netlab", netlab), ("restart", restart),
            ("coordinator", coordinator), ("soak", soak)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--only", default="", help="comma-separated: " +
                    ",".join(n for n, _ in SECTIONS))
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    args.shoal, args.worker = os.path.abspath(args.shoal), os.path.abspath(args.worker)
    only = [x for x in args.only.split(",") if x]
    # a SIGTERM (meson's timeout) unwinds through the finally blocks, which
    # kill every process and remove the namespaces
    def on_term(signum, frame):
        raise KeyboardInterrupt("SIGTERM")
    signal.signal(signal.SIGTERM, on_term)
    tmp = tempfile.mkdtemp(prefix="shoal-cluster-more-")
    t00 = time.time()
    try:
        # the bundled model as a container, its 3-way shard with 2 replicas,
        # and its in-process baseline (netlab, restart, coordinator)
        args.ct = os.path.join(tmp, "ct")
        args.sh2 = os.path.join(tmp, "sh2")
        if not only or set(only) & {"netlab", "restart", "coordinator"}:
            setup([args.shoal, "convert", L.MODEL, args.ct])
            shard(args, args.ct, args.sh2, 3, 2)
            args.base = Gen(args.shoal, tmp, "base", args.ct, PROMPT, GEN)
            check("bundled model: in-process baseline", args.base.rc == 0 and args.base.logits,
                  detail(args.base))
        for name, fn in SECTIONS:
            if only and name not in only:
                continue
            t0 = time.time()
            try:
                fn(args, tmp)
            except Exception as e:   # a broken scenario must not hide the others
                check(name, False, "exception: %r" % e)
            finally:
                L.kill_all()
            print("-- %s: %.1f s" % (name, time.time() - t0), flush=True)
        check("no sanitizer report from any coordinator run", not L.sanitizer_reports,
              ", ".join(L.sanitizer_reports))
        reports = []
        for n in sorted(os.listdir(tmp)):
            if n.endswith((".log", ".err")):
                with open(os.path.join(tmp, n), errors="replace") as f:
                    text = f.read()
                if "Sanitizer" in text or "runtime error:" in text:
                    reports.append(n)
        check("no sanitizer report in any worker log or coordinator stderr", not reports,
              ", ".join(reports))
    finally:
        L.kill_all()
        if args.keep:
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print("total %.1f s" % (time.time() - t00))
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
