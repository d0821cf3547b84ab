"""Helpers shared by the multi-process cluster tests (tests/cluster/*.py):
`shoal run` with its logits and ids, reading a pipe until a pattern,
`shoal status --json` polling; and, from tests/harness.py, PASS/FAIL
bookkeeping, the process registry that finally-blocks kill, shoal-worker
processes with their logs.

Every process a helper starts is registered in `procs`; `kill_all()` kills
the ones still running (SIGCONT first, so a SIGSTOPped one can die).
"""
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
# the process registry, ports, workers and the recorder are tests/harness.py's
from harness import (ROOT, MODEL, procs, env, kill_all, free_port,  # noqa: E402,F401
                     Worker, run)
import harness  # noqa: E402

sanitizer_reports = []    # names of runs whose stderr holds an ASan/UBSan report


def Results():
    """PASS/FAIL lines and their counts; the summary counts skips too."""
    return harness.Results(skips=True)


def start_workers(binary, tmp, name, models, *flags, **kw):
    """One worker per model directory (port 0 each); raises if one does
    not come up."""
    ws = []
    try:
        for i, m in enumerate(models):
            ws.append(Worker(binary, tmp, "%s-%d" % (name, i), m, *flags, **kw))
        for w in ws:
            if not w.wait_ready():
                raise RuntimeError("worker %s did not start: %s" % (w.log_path, w.text()[-600:]))
    except BaseException:
        stop_workers(ws)
        raise
    return ws


def stop_workers(ws):
    for w in ws:
        w.stop()


def workers_flag(ws):
    return ["--workers", ",".join(w.addr for w in ws)]


class Gen:
    """One `shoal run` to completion: rc, out (text), err, logits (bytes of
    the --logits-out .npy), ids (text of --ids-out), seconds.

    prompt: a list of `shoal run` flags giving the prompt (--prompt TEXT or
    --tokens IDS); gen: the generation flags; flags: the rest."""

    def __init__(self, shoal, tmp, name, model, prompt, gen, flags=(), timeout=300):
        self.logits_path = os.path.join(tmp, name + ".npy")
        self.ids_path = os.path.join(tmp, name + ".ids")
        for p in (self.logits_path, self.ids_path):
            if os.path.exists(p):
                os.unlink(p)
        cmd = [shoal, "run", "--model", model] + list(prompt) + [
            "--logits-out", self.logits_path, "--ids-out", self.ids_path] + list(gen) + list(flags)
        t0 = time.time()
        # bytes, not text=True: a model's \r must not become \n
        r = subprocess.run(cmd, capture_output=True, timeout=timeout, env=env())
        self.seconds = time.time() - t0
        self.rc = r.returncode
        self.out = r.stdout.decode("utf-8", "replace")
        self.err = r.stderr.decode("utf-8", "replace")
        if "Sanitizer" in self.err or "runtime error:" in self.err:
            sanitizer_reports.append(name)
        self.logits = read_bytes(self.logits_path)
        ids = read_bytes(self.ids_path)
        self.ids = ids.decode() if ids is not None else None


def read_bytes(path):
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        return f.read()


def same(a, b):
    """Both succeeded with identical logits bytes, ids and text."""
    return (a.rc == 0 and b.rc == 0 and a.logits is not None and a.logits == b.logits and
            a.ids == b.ids and a.out == b.out)


def detail(g):
    return "rc=%d %.1fs stderr: %s" % (g.rc, g.seconds, g.err.strip()[-800:])


def read_until(p, pattern, timeout):
    """Read p.stdout (binary) until pattern (bytes regex) matches, EOF or
    timeout; returns the bytes read."""
    buf = b""
    t0 = time.time()
    fd = p.stdout.fileno()
    os.set_blocking(fd, False)
    while time.time() - t0 < timeout:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            chunk = None
        if chunk:
            buf += chunk
            if re.search(pattern, buf):
                return buf
        elif chunk == b"":
            return buf
        else:
            time.sleep(0.002)
    return buf


def read_rest(p):
    """Blocking read of p.stdout to EOF."""
    fd = p.stdout.fileno()
    os.set_blocking(fd, True)
    out = b""
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return out
        out += chunk


def control_addr(err_path, timeout=60, p=None):
    """The control address a coordinator printed to its stderr file."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        with open(err_path, errors="replace") as f:
            m = re.search(r"control (\d+\.\d+\.\d+\.\d+:\d+)", f.read())
        if m:
            return m.group(1)
        if p is not None and p.poll() is not None:
            return None
        time.sleep(0.05)
    return None


def query_status(shoal, addr, *flags, timeout=60):
    """`shoal status --control ADDR [flags]`: (rc, stdout, stderr)."""
    r = subprocess.run([shoal, "status", "--control", addr] + list(flags),
                       capture_output=True, text=True, timeout=timeout, env=env())
    return r.returncode, r.stdout, r.stderr


def status_json(shoal, addr):
    """The coordinator's status as a dict, or None when it does not answer."""
    rc, out, _ = query_status(shoal, addr, "--json", "--timeout", "3")
    if rc != 0:
        return None
    try:
        return json.loads(out)
    except ValueError:
        return None


def executor(st, address):
    """The status row of the executor at address, or None."""
    if not st:
        return None
    rows = [e for e in st["executors"] if e["address"] == address]
    return rows[0] if rows else None


def poll(fn, timeout, interval=0.2):
    """Call fn() until it returns a true value or timeout s pass; returns
    (value, seconds)."""
    t0 = time.time()
    while True:
        v = fn()
        if v or time.time() - t0 >= timeout:
            return v, time.time() - t0
        time.sleep(interval)

