"""What the test scripts share (tests/*/*.py): the PASS/FAIL recorder with
its closing summary line and exit status, subprocesses with timeouts, the
shared data directory (../shared) with a clear SKIP when it is absent, free
ports, and `shoal serve` / `shoal-worker` processes started, waited for
(their "listening" lines) and stopped.

A script in tests/DIR/ imports it with

    sys.path.insert(0, os.path.dirname(HERE))   # tests/
    import harness as H

Cluster-only helpers (`shoal run` with its logits, status polling) stay in
tests/cluster/clusterlib.py, which re-exports the pieces below it uses.
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
MODEL = os.path.join(ROOT, "models", "shakespeare-moe")
SHARED = os.path.normpath(os.path.join(ROOT, "..", "shared"))

procs = []                # every process started through Worker, for kill_all()


class Results:
    """The pass/fail recorder.

    results(name, ok, detail) prints "PASS name detail" (a pass's detail:
    its first line, short) or "FAIL name detail" and returns ok;
    results.check(cond, what) is the same with no detail. quiet: only the
    failures are printed, as "FAIL: what". summary() prints the closing
    line, "N passed, M failed" (", K skipped" too when skips is set), or
    with a tag "TAG: N checks, M failed", and returns the exit status:
    1 when anything failed, else 0.
    """

    def __init__(self, quiet=False, skips=False):
        self.quiet = quiet
        self.skips = skips
        self.passed = self.failed = self.skipped = 0
        self.fails = []

    def __call__(self, name, ok, detail=""):
        ok = bool(ok)
        self.passed += ok
        self.failed += not ok
        detail = "" if detail is None else str(detail)
        if not ok:
            self.fails.append(name)
            if self.quiet:
                print("FAIL:", name, flush=True)
            else:
                print(" ".join(w for w in ("FAIL", name, detail) if w), flush=True)
        elif not self.quiet:
            short = detail.strip().split("\n")[0][:100]   # a pass's detail: its first line
            print(" ".join(w for w in ("PASS", name, short) if w), flush=True)
        return ok

    def check(self, cond, what):
        return self(what, cond)

    def skip(self, name, why):
        self.skipped += 1
        print("SKIP %s: %s" % (name, why), flush=True)

    @property
    def checks(self):
        return self.passed + self.failed

    def summary(self, tag=None):
        if tag:
            print("%s: %d checks, %d failed" % (tag, self.checks, self.failed))
        elif self.skips:
            print("%d passed, %d failed, %d skipped" % (self.passed, self.failed, self.skipped))
        else:
            print("%d passed, %d failed" % (self.passed, self.failed))
        return 1 if self.failed else 0


def env(extra=None, default=None):
    """The caller's environment, with extra set and default's variables
    set where the caller has none."""
    e = dict(os.environ)
    for k, v in (default or {}).items():
        e.setdefault(k, v)
    e.update(extra or {})
    return e


def run(cmd, *, timeout=300, env=None, env_default=None, text=True, **kw):
    """subprocess.run with its output captured and a timeout; env: variables
    over the caller's environment, env_default: ones set where unset."""
    return subprocess.run(cmd, capture_output=True, text=text, timeout=timeout,
                          env=globals()["env"](env, env_default), **kw)


def shared(*parts):
    """The path of ../shared/PARTS (the shared data set beside the repository)."""
    return os.path.join(SHARED, *parts)


def shared_or_skip(what, *parts, results=None):
    """The path of ../shared/PARTS, or None after printing "SKIP what: PATH
    not found (the shared data directory ../shared)"; counted as a skip
    by results when given."""
    p = shared(*parts)
    if os.path.exists(p):
        return p
    why = "%s not found (the shared data directory ../shared)" % p
    if results is not None:
        results.skip(what, why)
    else:
        print("SKIP %s: %s" % (what, why), flush=True)
    return None


def free_port(host="127.0.0.1"):
    s = socket.socket()
    s.bind((host, 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_for(read, pattern, proc=None, timeout=60, interval=0.05):
    """Call read() until its text matches pattern (a regex), proc exits or
    timeout s pass; returns the match or None."""
    t0 = time.time()
    while True:
        m = re.search(pattern, read())
        if m or time.time() - t0 >= timeout:
            return m
        if proc is not None and proc.poll() is not None:
            return re.search(pattern, read())
        time.sleep(interval)


def stop(p, timeout=20, sig=signal.SIGTERM):
    """Signal p (SIGCONT first, so a stopped one can act on it), SIGKILL
    after timeout s; returns its exit status."""
    if p.poll() is None:
        try:
            os.kill(p.pid, signal.SIGCONT)
        except OSError:
            pass
        p.send_signal(sig)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return p.returncode


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

    def _since_start(self):
        with open(self.log_path, "rb") as f:
            f.seek(self._skip)
            return f.read().decode("utf-8", "replace")

    def wait_ready(self, timeout=60):
        """Wait for the 'listening' and 'serving' lines; returns the bound
        address or None."""
        def ready():
            t = self._since_start()
            return t if "serving " in t else ""
        m = wait_for(ready, r"listening on (\S+)", self.p, timeout)
        if m is None:
            return None
        self.addr = m.group(1)
        return self.addr

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
        stop(self.p)
        if not self.log.closed:
            self.log.close()
        return self.p.returncode


class Server:
    """`shoal serve` on a free loopback port (--port 0, the port read back
    from its "listening on" line), its stderr in a temporary file; raises
    SystemExit with the log when it does not start within 60 s."""

    def __init__(self, shoal, *extra, model=MODEL):
        self.err = tempfile.TemporaryFile(mode="w+")
        self.p = subprocess.Popen([shoal, "serve", "--model", model, "--port", "0",
                                   "--threads", "2", *extra], stdout=subprocess.DEVNULL,
                                  stderr=self.err, env=env({"OMP_WAIT_POLICY": "passive"}))
        m = wait_for(self.log, r"listening on http://127\.0\.0\.1:(\d+)", self.p, 60)
        self.port = int(m.group(1)) if m else None
        if self.port is None:
            raise SystemExit("shoal serve did not start:\n" + self.log())

    def log(self):
        self.err.seek(0)
        return self.err.read()

    def conn(self, timeout=60):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, raw=None):
        """Returns (status, headers dict, body bytes)."""
        c = self.conn()
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        out = (r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
        c.close()
        return out

    def post(self, path, body, **kw):
        return self.request("POST", path, body, **kw)

    def stop(self):
        """SIGTERM (SIGKILL after 30 s); returns the exit status."""
        self.p.terminate()
        try:
            rc = self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rc = self.p.wait()
        return rc
