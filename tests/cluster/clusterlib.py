"""Helpers shared by the multi-process cluster tests (tests/cluster/*.py):
PASS/FAIL bookkeeping, the process registry that finally-blocks kill,
shoal-worker processes with their logs, `shoal run` with its logits and
ids, reading a pipe until a pattern, `shoal status --json` polling.

Every process a helper starts is registered in `procs`; `kill_all()` kills
the ones still running (SIGCONT first, so a SIGSTOPped one can die).
"""
import json
import os
import re
import signal
import socket
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODEL = os.path.join(ROOT, "models", "shakespeare-moe")

procs = []                # every process started here, for kill_all()
sanitizer_reports = []    # names of runs whose stderr holds an ASan/UBSan report


class Results:
    """PASS/FAIL lines and their counts."""

    def __init__(self):
        self.passed = self.failed = self.skipped = 0

    def __call__(self, name, ok, detail=""):
        ok = bool(ok)
        self.passed += ok
        self.failed += not ok
        if ok:   # the details of a pass: its first line, short
            detail = str(detail).strip().split("\n")[0][:100]
        print("%s %s %s" % ("PASS" if ok else "FAIL", name, detail), flush=True)
        return ok

    def skip(self, name, why):
        self.skipped += 1
        print("SKIP %s: %s" % (name, why), flush=True)

    def summary(self):
        print("%d passed, %d failed, %d skipped" % (self.passed, self.failed, self.skipped))
        return 1 if self.failed else 0


def env():
    """The environment of every process: the caller's. The OpenMP wait
    policy is shoal's own default (it holds on a shared machine), the one
    users get."""
    return dict(os.environ)


def kill_all():
    """Kill every registered process still running (SIGCONT first)."""
    for p in procs:
        if p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGCONT)
            except OSError:
                pass
            p.kill()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def free_port(host="127.0.0.1"):
    s = socket.socket()
    s.bind((host, 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Worker:
    """A shoal-worker process with its log in TMP/NAME.log.

    listen: the --listen address (port 0 picks one; the bound address is
    read back from the log by wait_ready). launch: how to start argv
    (default subprocess.Popen; netlab's Host.popen puts it in a namespace).
    """

    def __init__(self, binary, tmp, name, model, *flags, listen="127.0.0.1:0", launch=None):
        self.log_path = os.path.join(tmp, name + ".log")
        self.log = open(self.log_path, "a")
        self._skip = self.log.tell()  # a restarted worker appends to the same log
        self.cmd = [binary, "--model", model, "--listen", listen] + list(flags)
        launch = launch or subprocess.Popen
        self.p = launch(self.cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env())
        procs.append(self.p)
        self.addr = None

    def wait_ready(self, timeout=60):
        """Wait for the 'serving' line; returns the bound address or None."""
        t0 = time.time()
        while time.time() - t0 < timeout:
            with open(self.log_path, "rb") as f:
                f.seek(self._skip)
                text = f.read().decode("utf-8", "replace")
            m = re.search(r"listening on (\S+)", text)
            if m and "serving " in text:
                self.addr = m.group(1)
                return self.addr
            if self.p.poll() is not None:
                return None
            time.sleep(0.05)
        return None

    def text(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def alive(self):
        return self.p.poll() is None

    def kill9(self):
        self.p.kill()
        self.p.wait()

    def stop(self):
        """SIGTERM (SIGKILL after 20 s); closes the log."""
        if self.p.poll() is None:
            try:
                os.kill(self.p.pid, signal.SIGCONT)
            except OSError:
                pass
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        if not self.log.closed:
            self.log.close()
        return self.p.returncode


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
    """`shoal status --coordinator ADDR [flags]`: (rc, stdout, stderr)."""
    r = subprocess.run([shoal, "status", "--coordinator", addr] + list(flags),
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


def run(cmd, timeout=300):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env())
