#!/usr/bin/env python3
"""shoal serve against slow clients (slowloris), on the bundled model:

  - 200 sockets that trickle a request head a byte every 2 s (and reconnect
    a second after the server closes them) and 20 that trickle a body: with
    the default limits /health and a greedy completion are still answered
    (a client timeout of 10 s; the latencies are printed), the completion's
    text is shoal run's, and /metrics counts the evictions;
  - the limits one by one (--max-connections 8
    --max-connections-per-address 4 --header-timeout 2), each on sockets
    from 127.0.0.1, .2 and .3:
      a head that trickles for ever is closed after the head deadline, a
      body under 1 KiB/s after its grace;
      a 5th connection from one address closes that address's oldest
      waiting one; with the table full, one from a new address closes the
      oldest waiting one of the address holding the most;
      a streaming request is never evicted: beside a flood of new sockets
      it ends with shoal run's text;
  - bad values of the flags are one-line usage errors, exit 2.

usage: test_slow_clients.py --shoal build-test/coordinator/shoal
"""
import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_serve as ts  # noqa: E402
from slowloris import SlowSockets  # noqa: E402
from test_load import metric, metrics  # noqa: E402

check = ts.check


# The slow sockets come from 127.0.0.1; the well-behaved client of the
# attack test from another address, as on a real network: the per-address
# cap lets a flood from one address evict only its own connections (from
# the same address, a new request in its head could lose to one that
# reconnected after it).
CLIENT = ("127.0.0.2", 0)


def timed_get(srv, path, timeout=10):
    """(status or error text, seconds) of GET path with a client timeout."""
    t0 = time.time()
    try:
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=timeout,
                                       source_address=CLIENT)
        c.request("GET", path)
        r = c.getresponse()
        r.read()
        c.close()
        return r.status, time.time() - t0
    except OSError as e:
        return repr(e), time.time() - t0


def timed_completion(srv, prompt, n, timeout=10):
    t0 = time.time()
    try:
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=timeout,
                                       source_address=CLIENT)
        c.request("POST", "/v1/completions",
                  body=json.dumps({"prompt": prompt, "max_tokens": n, "temperature": 0}),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        b = r.read()
        c.close()
        text = json.loads(b)["choices"][0]["text"] if r.status == 200 else None
        return r.status, text, time.time() - t0
    except OSError as e:
        return repr(e), None, time.time() - t0


def test_under_attack(shoal):
    ref = ts.shoal_run(shoal, "ROMEO:", 8)
    srv = ts.Server(shoal)
    try:
        with SlowSockets(srv.port, 200) as heads, \
                SlowSockets(srv.port, 20, body=True) as bodies:
            time.sleep(3)   # the sockets hold what they can
            lat = []
            for i in range(5):
                st, secs = timed_get(srv, "/health")
                check(st == 200, "/health answers beside 220 slow sockets (%r after %.1f s)" %
                      (st, secs))
                st, text, secs2 = timed_completion(srv, "ROMEO:", 8)
                check(st == 200 and text == ref,
                      "a completion beside 220 slow sockets gives shoal run's text (%r, %r)" %
                      (st, text))
                lat.append((secs, secs2))
                time.sleep(0.5)
            print("beside 220 slow sockets: /health %s s, completion %s s" %
                  ([round(a, 3) for a, _ in lat], [round(b, 3) for _, b in lat]), flush=True)
            m = metrics(srv)
            check(metric(m, "shoal_http_connections_closed_total", reason="evicted") > 0,
                  "/metrics counts evicted connections (%r)" %
                  metric(m, "shoal_http_connections_closed_total", reason="evicted"))
            check(metric(m, "shoal_http_connections") <= 64,
                  "open connections within the default limit (%d)" %
                  metric(m, "shoal_http_connections"))
            check(heads.closed > 0, "the server closed slow sockets (%d)" % heads.closed)
            print("slow sockets: %d opened, %d closed by the server; %d body tricklers "
                  "opened, %d closed" % (heads.opened, heads.closed, bodies.opened,
                                          bodies.closed), flush=True)
    finally:
        check(srv.stop() == 0, "serve exits 0 on SIGTERM after the attack")


def sock(srv, src):
    """A connected socket from source address src (127.0.0.x)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((src, 0))
    s.connect(("127.0.0.1", srv.port))
    return s


def is_closed(s, wait=2.0):
    """1 when the server closed s within wait seconds (end of stream)."""
    s.settimeout(wait)
    try:
        return s.recv(4096) == b""
    except socket.timeout:
        return False
    except ConnectionResetError:
        return True


def test_limits(shoal):
    srv = ts.Server(shoal, "--max-connections", "8", "--max-connections-per-address", "4",
                    "--header-timeout", "2")
    try:
        # the head deadline: a byte every 0.5 s (an idle timeout never fires)
        with SlowSockets(srv.port, 1, every=0.5, reconnect=3600) as head, \
                SlowSockets(srv.port, 1, every=0.5, reconnect=3600, body=True,
                            host="127.0.0.1") as body:
            deadline = time.time() + 15
            while (head.closed < 1 or body.closed < 1) and time.time() < deadline:
                time.sleep(0.1)
            check(head.closed == 1 and 1.5 < head.lifetimes[0] < 8,
                  "a head trickled for ever is closed after --header-timeout 2 (after %r s)" %
                  head.lifetimes)
            check(body.closed == 1 and 1.5 < body.lifetimes[0] < 8,
                  "a body under 1 KiB/s is closed after its 2 s grace (after %r s)" %
                  body.lifetimes)
        m = metrics(srv)
        check(metric(m, "shoal_http_connections_closed_total", reason="head_timeout") >= 1 and
              metric(m, "shoal_http_connections_closed_total", reason="body_slow") == 1,
              "/metrics counts the head timeout and the slow body")
    finally:
        check(srv.stop() == 0, "serve exits 0 on SIGTERM")

    # the caps, on quiet sockets (a head deadline longer than the test)
    srv = ts.Server(shoal, "--max-connections", "8", "--max-connections-per-address", "4",
                    "--test-token-delay", "100")
    try:
        # per-address cap: the 5th from .1 closes .1's oldest waiting one
        ones = []
        for _ in range(4):
            ones.append(sock(srv, "127.0.0.1"))
            time.sleep(0.05)
        twos = [sock(srv, "127.0.0.2") for _ in range(2)]
        time.sleep(0.2)
        ones.append(sock(srv, "127.0.0.1"))
        check(is_closed(ones[0]), "a 5th connection from 127.0.0.1 closes its oldest")
        check(not any(is_closed(s, 0.3) for s in ones[1:] + twos),
              "the others stay open")
        # the table full (4 + 2 + 2 = 8): a new address evicts from .1 (holds most)
        threes = [sock(srv, "127.0.0.3") for _ in range(2)]
        time.sleep(0.2)
        check(not any(is_closed(s, 0.2) for s in ones[1:] + twos + threes),
              "8 connections fit")
        four = sock(srv, "127.0.0.4")
        check(is_closed(ones[1]), "with the table full, a new address closes the oldest "
              "waiting connection of the address holding the most")
        check(not any(is_closed(s, 0.3) for s in ones[2:] + twos + threes + [four]),
              "the other addresses keep theirs")
        for s in ones + twos + threes + [four]:
            s.close()

        # a streaming request (100 ms a token) is never evicted
        ref = ts.shoal_run(shoal, "JULIET:", 12)
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
        c.request("POST", "/v1/completions",
                  body=json.dumps({"prompt": "JULIET:", "max_tokens": 12, "temperature": 0,
                                   "stream": True}),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        check(r.status == 200, "the stream starts (%d)" % r.status)
        with SlowSockets(srv.port, 30, every=0.2, reconnect=0.05):
            raw = r.read()
        c.close()
        events = ts.sse_events(raw)
        text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]
                       if json.loads(e).get("choices"))
        check(events and events[-1] == "[DONE]" and text == ref,
              "a stream beside a flood of new sockets from its address ends with shoal run's "
              "text (%r vs %r)" % (text, ref))
        st, _ = timed_get(srv, "/health")
        check(st == 200, "/health after the flood (%r)" % st)
    finally:
        check(srv.stop() == 0, "serve exits 0 on SIGTERM")


def test_bad_flags(shoal):
    for args, want in ((["--max-connections", "0"], "--max-connections"),
                       (["--max-connections", "x"], "--max-connections"),
                       (["--max-connections", "4", "--max-connections-per-address", "5"],
                        "--max-connections-per-address"),
                       (["--header-timeout", "0"], "--header-timeout")):
        r = subprocess.run([shoal, "serve", "--model", ts.MODEL, "--port", "0"] + args,
                           capture_output=True, text=True, timeout=60)
        lines = r.stderr.strip().splitlines()
        check(r.returncode == 2 and len(lines) == 1 and want in lines[0],
              "serve %s: one usage error line naming %s, exit 2 (exit %d: %r)" %
              (" ".join(args), want, r.returncode, r.stderr[:300]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    a = ap.parse_args()
    shoal = os.path.abspath(a.shoal)
    test_bad_flags(shoal)
    test_limits(shoal)
    test_under_attack(shoal)
    return ts.result.summary("test_slow_clients")


if __name__ == "__main__":
    sys.exit(main())
