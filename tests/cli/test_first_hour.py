#!/usr/bin/python3
"""A new user's first hour (issue 32, items 2, 4, 5 and 7), on real processes.

usage: /usr/bin/python3 tests/cli/test_first_hour.py --shoal build-test/coordinator/shoal
           --worker build-test/worker/shoal-worker

Cases (each failed on the code before):
  workers:  run, chat, serve and bench with --workers where no worker comes up
            (refused ports, a worker with another cluster key, a worker on another
            container) fail with one line naming each worker and why, exit 1,
            although the local experts could run everything; --local-fallback
            keeps the run going with a warning; --local-fallback with
            --local-experts off or without --workers is a usage error (exit 2)
  logs:     stdout and stderr into one pipe, a worker killed while the reply
            stands mid-line: the 'warn cluster: worker ... is down' line starts
            a line of its own, and the text without the log lines is the solo
            run's (one line break may come before each log line)
  model:    every command that takes --model, given a directory that is no
            model (run, chat, serve, perplexity, bench, synth --check, inspect,
            shard, convert SRC, tokenize, detokenize): "not a model directory",
            one line, exit 2; bench fails before its probes
  convert:  a checkpoint without a tokenizer converts with one warning line
            saying the container has no tokenizer and prompts must be --tokens
  control:  a busy --control (or --accept-workers) port: the error names
            --control off or another port
Ends with "N passed, M failed"; exit status 1 if anything failed.
"""

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "cluster"))
import clusterlib as L  # noqa: E402
import harness as H  # noqa: E402  (tests/, on the path through clusterlib)
MODEL = os.path.join(ROOT, "models", "shakespeare-moe")
PROMPT = "ROMEO:\nBut soft, what light through yonder window breaks?\nJULIET:\n"
TIMEOUT = 180
# a log line: the default sink's "HH:MM:SS.mmm level component: " or a CLI line
LOG_RE = re.compile(r"\d\d:\d\d:\d\d\.\d{3} (?:error|warn|info|debug) \w+: |shoal: ")

result = H.Results()


def run(cmd, timeout=TIMEOUT, **kw):
    return H.run(cmd, timeout=timeout, env_default={"OMP_WAIT_POLICY": "passive"}, **kw)


def show(r):
    return "rc=%s stderr=%r" % (r.returncode, r.stderr.strip()[-700:])


def dead_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return "127.0.0.1:%d" % port


# ------------------------------------------------------------------ item 2

def no_worker_up(a, tmp):
    ct = a.ct
    d1, d2 = dead_port(), dead_port()
    fast = ["--control", "off", "--connect-timeout", "1"]
    cases = [
        ("run", [a.shoal, "run", ct, "--prompt", "ROMEO:", "--max-tokens", "4"], None),
        ("chat", [a.shoal, "chat", ct, "--max-tokens", "4"], "hello\n"),
        ("serve", [a.shoal, "serve", ct, "--port", "0"], None),
        ("bench", [a.shoal, "bench", ct, "--limits", "off", "--reps", "1", "--gen", "2"], None),
    ]
    for name, cmd, stdin in cases:
        try:   # serve that goes on without its workers would serve until killed
            r = run(cmd + ["--workers", "%s,%s" % (d1, d2)] + fast, input=stdin, timeout=60)
        except subprocess.TimeoutExpired:
            result("%s --workers, none up: exits" % name, False, "still running after 60 s")
            continue
        lines = [l for l in r.stderr.splitlines() if "no worker of --workers is up" in l]
        result("%s --workers, none up (2 refused ports): exit 1, one line naming each "
               "worker and why, and --local-fallback" % name,
               r.returncode == 1 and len(lines) == 1 and d1 in lines[0] and d2 in lines[0]
               and lines[0].count("refused") == 2 and "--local-fallback" in lines[0],
               show(r))
    # the fallback on purpose: today's run, with its warning
    r = run(cases[0][1] + ["--workers", d1, "--local-fallback"] + fast)
    result("run --workers, none up, --local-fallback: the local experts run it, a warning",
           r.returncode == 0 and "warning" in r.stderr and "--local-fallback" in r.stderr
           and d1 in r.stderr and "0 of 1 workers up + local experts" in r.stderr
           and r.stdout.startswith("ROMEO:"), show(r))
    for extra, want in ((["--workers", d1, "--local-experts", "off"], "--local-experts"),
                        ([], "need --workers")):
        r = run(cases[0][1] + ["--local-fallback"] + extra + fast[:2])
        result("--local-fallback %s: a usage error, one line, exit 2" % " ".join(extra),
               r.returncode == 2 and want in r.stderr and
               len(r.stderr.strip().splitlines()) == 1, show(r))

    # real workers that refuse this coordinator: another key, another container
    key = os.path.join(tmp, "cluster.key")
    other = os.path.join(tmp, "other.key")
    for path, k in ((key, "c2hvYWwtdGVzdC1jbHVzdGVyLWtleS0wMTIzNDU2Nzg5\n"),
                    (other, "YW5vdGhlci1rZXktbm90LXRoZS1jbHVzdGVyLW9uZQ==\n")):
        with open(path, "w") as f:
            f.write(k)
        os.chmod(path, 0o600)
    for what, model, wflags, cflags, why in (
            ("with a wrong cluster key", ct, ["--cluster-key", key], ["--cluster-key", other],
             "authentication"),
            ("against a worker on another container", a.other, [], [], "fingerprint")):
        ws = L.start_workers(a.worker, tmp, why, [model], *wflags)
        try:
            r = run(cases[0][1] + ["--workers", ws[0].addr] + cflags + fast[:2] +
                    ["--connect-timeout", "3"])
            lines = [l for l in r.stderr.splitlines() if "no worker of --workers is up" in l]
            result("run %s, local experts on: exit 1, one line naming the worker and %s"
                   % (what, why), r.returncode == 1 and len(lines) == 1 and
                   ws[0].addr in lines[0] and why in lines[0] and r.stdout == "", show(r))
        finally:
            L.stop_workers(ws)


# ------------------------------------------------------------------ item 4

def strip_logs(data):
    """(text without its log lines, [(offset in that text, log line)])."""
    text, logs = "", []
    for line in data.splitlines(keepends=True):
        if LOG_RE.match(line):
            logs.append((len(text), line))
        else:
            text += line
    return text, logs


def matches_solo(text, logs, solo):
    """text is solo with at most one '\\n' added just before each log line."""
    spots = [o for o, _ in logs if 0 < o <= len(text) and text[o - 1] == "\n"]
    spots = sorted(set(spots))
    for mask in range(1 << len(spots)):
        t = text
        for i in reversed(range(len(spots))):
            if mask >> i & 1:
                t = t[:spots[i] - 1] + t[spots[i]:]
        if t == solo:
            return True
    return False


def logs_in_stream(a, tmp):
    gen = ["--max-tokens", "400", "--seed", "11", "--temp", "0.9", "--ignore-eos",
           "--threads", "1"]
    solo = run([a.shoal, "run", a.ct, "--prompt", PROMPT] + gen)
    if not result("solo run", solo.returncode == 0, show(solo)):
        return
    glued_seen = broke = None
    for attempt in range(4):
        ws = L.start_workers(a.worker, tmp, "stream-%d" % attempt, [a.ct])
        try:
            p = subprocess.Popen([a.shoal, "run", a.ct, "--prompt", PROMPT, "--workers",
                                  ws[0].addr, "--control", "off"] + gen,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 env=H.env(default={"OMP_WAIT_POLICY": "passive"}))
            L.procs.append(p)
            head = L.read_until(p, re.escape(PROMPT.encode()) + rb"[\s\S]{12}", 120)
            # pause it where its reply stands mid-line, then kill the worker
            midline = False
            for _ in range(200):
                os.kill(p.pid, signal.SIGSTOP)
                time.sleep(0.02)
                head += L.read_until(p, rb"(?!)", 0.05)
                if head and not head.endswith(b"\n"):
                    midline = True
                    break
                os.kill(p.pid, signal.SIGCONT)
                time.sleep(0.003)
            ws[0].kill9()
            os.kill(p.pid, signal.SIGCONT)
            rest = L.read_rest(p)
            rc = p.wait(timeout=TIMEOUT)
        finally:
            L.stop_workers(ws)
        data = (head + rest).decode("utf-8", "replace")
        down = re.search(r"warn cluster: worker %s is down" % re.escape(ws[0].addr), data)
        if rc != 0 or not midline or down is None:
            result("worker killed mid-line (attempt %d): it ran, the reply was paused "
                   "mid-line and the worker reported down" % attempt,
                   attempt < 3, "rc=%s midline=%s: %r" % (rc, midline, data[-600:]))
            continue
        # every log line starts a line of its own
        glued = [m.start() for m in LOG_RE.finditer(data) if m.start() and
                 data[m.start() - 1] != "\n"]
        text, logs = strip_logs(data)
        glued_seen = (glued, data)
        broke = matches_solo(text, logs, solo.stdout)
        break
    if glued_seen is None:
        result("a log line while the reply streams: provoked", False, "no attempt got there")
        return
    glued, data = glued_seen
    result("stdout and stderr in one pipe, a worker killed mid-line: every log line "
           "starts a line", not glued,
           "; ".join(repr(data[max(0, g - 40):g + 60]) for g in glued[:3]))
    result("... and the text without the log lines is the solo run's", broke,
           repr(data[-400:]))


# ------------------------------------------------------------------ item 5

def not_a_model(a, tmp):
    d = os.path.join(ROOT, "docs")
    out = os.path.join(tmp, "nm-out")
    cmds = [
        ("run", ["run", "--model", d, "--prompt", "x"]),
        ("chat", ["chat", "--model", d]),
        ("serve", ["serve", "--model", d, "--port", "0"]),
        ("perplexity", ["perplexity", "--model", d, "--file", os.path.join(ROOT, "README.md")]),
        ("bench", ["bench", "--model", d]),
        ("synth --check", ["synth", "--check", "--model", d]),
        ("inspect", ["inspect", d]),
        ("shard", ["shard", "--model", d, "--shards", "2", "--out", out]),
        ("convert SRC", ["convert", d, out]),
        ("tokenize", ["tokenize", "--model", d, "--text", "x"]),
        ("detokenize", ["detokenize", "--model", d, "--ids", "1"]),
    ]
    for name, cmd in cmds:
        t0 = time.time()
        r = run([a.shoal] + cmd, input="")
        secs = time.time() - t0
        lines = r.stderr.strip().splitlines()
        result("%s --model docs: 'not a model directory', one line naming it, exit 2" % name,
               r.returncode == 2 and len(lines) == 1 and "not a model directory" in lines[0]
               and "'%s'" % d in lines[0] and "config.json" in lines[0], show(r))
        if name == "bench":
            result("bench on a directory that is no model: fails before the probes",
                   "probe" not in r.stderr and secs < 10, "%.1f s %s" % (secs, show(r)))
    # an empty directory too, and bench on a checkpoint whose config.json is broken
    empty = os.path.join(tmp, "empty")
    os.makedirs(empty, exist_ok=True)
    r = run([a.shoal, "bench", empty])
    result("bench on an empty directory: one line, exit 2, no probe",
           r.returncode == 2 and "not a model directory" in r.stderr and
           "probe" not in r.stderr, show(r))
    broken = os.path.join(tmp, "broken")
    os.makedirs(broken, exist_ok=True)
    with open(os.path.join(broken, "config.json"), "w") as f:
        f.write("{\"model_type\": \"nonesuch\"}\n")
    t0 = time.time()
    r = run([a.shoal, "bench", broken, "--ram-mb", "512"])
    result("bench on a checkpoint with a broken config.json: fails before the probes",
           r.returncode != 0 and "probe" not in r.stderr and "rep 1" not in r.stderr and
           "nonesuch" in r.stderr, "%.1f s %s" % (time.time() - t0, show(r)))


# ------------------------------------------------------------------ item 7

def convert_without_tokenizer(a, tmp):
    src = os.path.join(tmp, "notok")
    os.makedirs(src, exist_ok=True)
    for f in os.listdir(MODEL):
        if f.endswith((".json", ".safetensors")) and not f.startswith("tokenizer"):
            shutil.copy(os.path.join(MODEL, f), src)
    dst = os.path.join(tmp, "notok-ct")
    r = run([a.shoal, "convert", src, dst])
    warn = [l for l in r.stderr.splitlines() if "tokenizer" in l]
    result("convert without a tokenizer: exit 0, one warning line: no tokenizer, "
           "prompts must be --tokens",
           r.returncode == 0 and len(warn) == 1 and "warning" in warn[0] and
           "--tokens" in warn[0] and src in warn[0], show(r))
    r = run([a.shoal, "convert", MODEL, os.path.join(tmp, "tok-ct")])
    result("convert with a tokenizer: no such warning",
           r.returncode == 0 and "tokenizer" not in r.stderr, show(r))


def busy_port(a, tmp):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    busy = "127.0.0.1:%d" % s.getsockname()[1]
    try:
        base = [a.shoal, "run", a.ct, "--prompt", "x", "--max-tokens", "2", "--workers",
                dead_port(), "--connect-timeout", "0.5"]
        r = run(base + ["--control", busy])
        lines = r.stderr.strip().splitlines()
        result("a busy --control port: one line naming it, 'in use', --control off or "
               "another port, exit 1",
               r.returncode == 1 and len(lines) == 1 and busy in lines[0] and
               "in use" in lines[0] and "--control off" in lines[0], show(r))
        r = run(base + ["--control", "off", "--accept-workers", busy])
        lines = r.stderr.strip().splitlines()
        result("a busy --accept-workers port: one line naming it and another port, exit 1",
               r.returncode == 1 and len(lines) == 1 and busy in lines[0] and
               "in use" in lines[0] and "free port" in lines[0], show(r))
    finally:
        s.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--only", help="run only these cases (comma-separated function names)")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    a.shoal = os.path.abspath(a.shoal)
    a.worker = os.path.abspath(a.worker)
    tmp = tempfile.mkdtemp(prefix="shoal-first-hour-")
    try:
        a.ct = os.path.join(tmp, "ct")
        a.other = os.path.join(tmp, "ct-int8")
        for cmd in ([a.shoal, "convert", MODEL, a.ct],
                    [a.shoal, "convert", MODEL, a.other, "--experts", "int8"]):
            r = run(cmd)
            if r.returncode != 0:
                print("FAIL setup: %s\n%s" % (" ".join(cmd), r.stderr))
                return 1
        cases = (no_worker_up, logs_in_stream, not_a_model, convert_without_tokenizer,
                 busy_port)
        only = set(a.only.split(",")) if a.only else None
        for fn in cases:
            if only and fn.__name__ not in only:
                continue
            try:
                fn(a, tmp)
            except Exception as e:   # a broken case must not hide the others
                result(fn.__name__, False, "exception: %r" % e)
                L.kill_all()
    finally:
        L.kill_all()
        if a.keep:
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return result.summary()


if __name__ == "__main__":
    sys.exit(main())
