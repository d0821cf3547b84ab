#!/usr/bin/env python3
"""shoal serve under load: 8 concurrent streaming clients x 50 requests
each (the bundled model, --parallel 4, so requests also queue), with random
disconnects, beside 200 slow sockets that trickle request heads a byte
every 2 s and reconnect when closed (slowloris.py; --slow-sockets 0: none).

  - every completed response equals its prompt's solo run (shoal run
    --greedy, the same max_tokens), streamed or whole;
  - a client that disconnects mid-stream cancels only its own request;
  - no slot or memory leak: after the load the server answers as before,
    its RSS is within 16 MiB of what it was after a first warm-up round and
    its open file descriptors other than sockets are as many as before (the
    slow sockets come and go; the server holds at most its
    --max-connections of them);
  - /metrics agrees with what the clients saw: generations by finish reason
    (the completed ones, the cancelled ones), completion tokens at least the
    sum of the completed usage counts, no request running or queued at the
    end.

usage: test_load.py --shoal build-test/coordinator/shoal [--clients 8] [--requests 50]
                    [--slow-sockets 200]
"""
import argparse
import http.client
import json
import os
import random
import re
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_serve as ts  # noqa: E402
from slowloris import SlowSockets  # noqa: E402
from test_serve import check  # noqa: E402

PROMPTS = ["ROMEO:", "JULIET:", "KING HENRY:", "First Citizen:\nBefore we proceed",
           "To be, or not", "O, what a rogue", "Now is the winter", "HAMLET: Words,",
           "Friends, Romans,", "All the world's a stage"]
MAX_TOKENS = 12


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        m = re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.M)
    return int(m.group(1))


def n_fds(pid):
    """(descriptors other than sockets, sockets) of process pid"""
    other = sockets = 0
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            is_socket = os.readlink("/proc/%d/fd/%s" % (pid, fd)).startswith("socket:")
        except OSError:
            continue   # closed meanwhile
        sockets += is_socket
        other += not is_socket
    return other, sockets


def metrics(srv):
    s, _, b = srv.request("GET", "/metrics")
    check(s == 200, "/metrics answers 200")
    out = {}
    for line in b.decode().splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def metric(m, name, **labels):
    """Sum of the samples of name whose labels include labels."""
    total = 0.0
    for k, v in m.items():
        base, _, lab = k.partition("{")
        if base != name:
            continue
        if all('%s="%s"' % (a, b) in lab for a, b in labels.items()):
            total += v
    return total


class Client(threading.Thread):
    """requests streamed (or whole, one in four) completions; some of the
    streamed ones disconnect after their first chunk."""

    def __init__(self, port, seed, requests, refs, drop_rate):
        super().__init__()
        self.port, self.rng, self.n = port, random.Random(seed), requests
        self.refs, self.drop_rate = refs, drop_rate
        self.completed, self.dropped, self.usage_tokens = 0, 0, 0
        self.bad = []

    def one(self, k):
        p = self.rng.randrange(len(PROMPTS))
        stream = self.rng.random() < 0.75
        drop = stream and self.rng.random() < self.drop_rate
        body = {"prompt": PROMPTS[p], "temperature": 0, "stream": stream,
                "max_tokens": 200 if drop else MAX_TOKENS,
                "stream_options": {"include_usage": True}}
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        c.request("POST", "/v1/completions", body=json.dumps(body),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            self.bad.append("request %d: HTTP %d %r" % (k, r.status, r.read()[:200]))
            c.close()
            return
        if drop:
            r.readline()   # the first event arrived: it is generating; leave
            c.sock.shutdown(2)
            c.close()
            self.dropped += 1
            return
        raw = r.read()
        c.close()
        if stream:
            events = [e[6:] for e in raw.decode().split("\n\n") if e.startswith("data: ")]
            if not events or events[-1] != "[DONE]":
                self.bad.append("request %d: the stream does not end with [DONE]" % k)
                return
            chunks = [json.loads(e) for e in events[:-1]]
            text = "".join(ch["choices"][0]["text"] for ch in chunks if ch.get("choices"))
            usage = [ch["usage"] for ch in chunks if ch.get("usage")]
            n = usage[0]["completion_tokens"] if usage else -1
        else:
            resp = json.loads(raw)
            text, n = resp["choices"][0]["text"], resp["usage"]["completion_tokens"]
        if text != self.refs[p]:
            self.bad.append("request %d (prompt %d, %s): %r, solo %r" %
                            (k, p, "streamed" if stream else "whole", text, self.refs[p]))
        self.completed += 1
        self.usage_tokens += n

    def run(self):
        for k in range(self.n):
            try:
                self.one(k)
            except (OSError, ValueError, KeyError) as e:
                self.bad.append("request %d: %r" % (k, e))


def round_of(port, refs, clients, requests, drop_rate, seed):
    cs = [Client(port, seed * 100 + i, requests, refs, drop_rate) for i in range(clients)]
    for c in cs:
        c.start()
    for c in cs:
        c.join()
    return cs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--slow-sockets", type=int, default=200)
    a = ap.parse_args()
    shoal = os.path.abspath(a.shoal)
    refs = [ts.shoal_run(shoal, p, MAX_TOKENS) for p in PROMPTS]
    check(len(set(refs)) > 5, "the prompts' solo runs differ: %r" % refs)
    srv = ts.Server(shoal, "--parallel", "4", "--queue", "64", "--test-token-delay", "2")
    slow = SlowSockets(srv.port, a.slow_sockets)
    try:
        slow.start()
        pid = srv.p.pid
        # warm-up round: the allocator's and the slots' high-water marks
        warm = round_of(srv.port, refs, a.clients, 4, 0.2, 1)
        time.sleep(0.5)
        rss0, fds0 = rss_kib(pid), n_fds(pid)
        m0 = metrics(srv)
        t0 = time.time()
        cs = round_of(srv.port, refs, a.clients, a.requests, 0.15, 2)
        wall = time.time() - t0
        bad = [b for c in warm + cs for b in c.bad]
        check(not bad, "every completed response equals its solo run (%d bad: %r)" %
              (len(bad), bad[:5]))
        completed = sum(c.completed for c in cs)
        dropped = sum(c.dropped for c in cs)
        check(completed + dropped == a.clients * a.requests,
              "all %d requests completed or were dropped by their client (%d + %d)" %
              (a.clients * a.requests, completed, dropped))
        check(dropped > 0, "some clients disconnected (%d)" % dropped)
        # the server settles: cancelled runs end at the next step, and every
        # request's outcome is counted (a dropped client can be done before
        # the server has noticed; the gauges count a run from its admission)
        deadline = time.time() + 30
        while time.time() < deadline:
            m1 = metrics(srv)
            n_fin = sum(metric(m1, "shoal_generations_total", finish=f) -
                        metric(m0, "shoal_generations_total", finish=f)
                        for f in ("stop", "length", "cancelled", "error"))
            if metric(m1, "shoal_requests_running") == 0 and \
                    metric(m1, "shoal_requests_queued") == 0 and \
                    n_fin >= a.clients * a.requests:
                break
            time.sleep(0.2)
        check(metric(m1, "shoal_requests_running") == 0 and
              metric(m1, "shoal_requests_queued") == 0,
              "nothing running or queued once the clients are done")
        fin = {f: metric(m1, "shoal_generations_total", finish=f) -
               metric(m0, "shoal_generations_total", finish=f)
               for f in ("stop", "length", "cancelled", "error")}
        check(fin["stop"] + fin["length"] == completed,
              "/metrics: %d generations ended stop/length, the clients completed %d (%r)" %
              (fin["stop"] + fin["length"], completed, fin))
        check(fin["cancelled"] == dropped,
              "/metrics: %d cancelled generations, %d clients left (%r)" %
              (fin["cancelled"], dropped, fin))
        check(fin["error"] == 0, "/metrics: no generation failed (%r)" % fin)
        toks = metric(m1, "shoal_completion_tokens_total") - \
            metric(m0, "shoal_completion_tokens_total")
        usage = sum(c.usage_tokens for c in cs)
        check(toks >= usage, "/metrics completion tokens %d >= the completed usage sum %d" %
              (toks, usage))
        time.sleep(0.5)
        rss1, fds1 = rss_kib(pid), n_fds(pid)
        check(rss1 - rss0 < 16 * 1024,
              "RSS flat: %d KiB after warm-up, %d KiB after %d requests" %
              (rss0, rss1, a.clients * a.requests))
        check(fds1[0] <= fds0[0], "open fds other than sockets flat: %d before, %d after" %
              (fds0[0], fds1[0]))
        # --max-connections (100 here: --parallel + --queue + 32), twice for
        # those closed and not yet reaped, the listener, the cluster's none
        check(fds1[1] <= 2 * 100 + 16 + 1, "sockets bounded beside %d slow sockets: %d" %
              (a.slow_sockets, fds1[1]))
        # and it still serves, the same text
        s, _, b = srv.post("/v1/completions", {"prompt": PROMPTS[0], "max_tokens": MAX_TOKENS,
                                               "temperature": 0})
        check(s == 200 and json.loads(b)["choices"][0]["text"] == refs[0],
              "after the load a request gives its solo text")
        print("load: %d requests (%d completed, %d dropped) in %.1f s, RSS %d -> %d KiB, "
              "fds %d -> %d, sockets %d -> %d; beside %d slow sockets (%d opened, %d closed "
              "by the server)" % (a.clients * a.requests, completed, dropped, wall, rss0, rss1,
                                  fds0[0], fds1[0], fds0[1], fds1[1], a.slow_sockets,
                                  slow.opened, slow.closed))
    finally:
        slow.stop()
        check(srv.stop() == 0, "serve exits 0 on SIGTERM")
    sys.exit(ts.result.summary("test_load"))


if __name__ == "__main__":
    main()
