#!/usr/bin/env python3
"""shoal serve with real clients, on the bundled model, one server with
--api-key and --cors:

  - the official OpenAI client (npm `openai`, run with node):
    tests/serve/test_openai_client.mjs (completions and chat, whole and
    streamed, against shoal run; the client's 401/400/404 error classes)
  - curl: bad JSON 400, a missing key 401, a foreign Host header 403, an
    unknown path 404, a 10 MB body 413, each an OpenAI error object, and the
    server still serving after each; a browser's CORS preflight (OPTIONS
    with Origin, no key) from the --cors origin is 204 with the
    Access-Control-Allow-* headers, and a request from it carries
    Access-Control-Allow-Origin; another origin gets none
  - slow clients: one that sends part of its headers and then nothing, one
    that sends headers announcing a body and then nothing: the server closes
    both after its head deadline or body grace (30 s) and serves the others meanwhile; one
    that opens a stream and reads nothing (a small receive buffer): others
    are served, and closing it leaves the server serving

Skips the node part with a message when node or the openai package is
missing (deploy/install-deps.sh installs both), and the curl part when curl
is missing.

usage: test_clients.py --shoal build-test/coordinator/shoal
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_serve as ts  # noqa: E402  (Server, check, error_object, healthy)

check = ts.check
KEY = "a-key-for-the-client-tests"
AUTH = {"Authorization": "Bearer " + KEY}
PAGE = "http://localhost:5173"   # the --cors origin
BODY = {"prompt": "ROMEO:", "max_tokens": 3, "temperature": 0}


def serves(srv, what, deadline_s=60):
    """A small completion gets a 200 within deadline_s (a 429 while the
    engine is busy is retried)."""
    t0 = time.time()
    s = None
    while time.time() - t0 < deadline_s:
        s, _, b = srv.post("/v1/completions", BODY, headers=AUTH)
        if s != 429:
            break
        time.sleep(0.2)
    check(s == 200 and json.loads(b)["choices"][0]["text"], "a completion is served " + what)


def test_node(shoal, srv):
    node = shutil.which("node") or shutil.which("nodejs")
    pkg = os.path.join(HERE, "node", "node_modules", "openai", "package.json")
    if not node or not os.path.exists(pkg):
        print("SKIP: the OpenAI client test needs node and the npm package openai in "
              "tests/serve/node/node_modules (run deploy/install-deps.sh); %s" %
              ("node not found" if not node else "openai not installed"), flush=True)
        return
    r = subprocess.run([node, os.path.join(HERE, "test_openai_client.mjs"),
                        "--base-url", "http://127.0.0.1:%d" % srv.port, "--api-key", KEY,
                        "--shoal", shoal, "--model", ts.MODEL],
                       capture_output=True, text=True, timeout=600)
    sys.stdout.write(r.stdout)
    sys.stdout.write(r.stderr)
    if r.returncode == 77:
        print("SKIP: the OpenAI client test skipped itself", flush=True)
        return
    check(r.returncode == 0 and "0 failed" in r.stdout,
          "the OpenAI client test passes (exit %d)" % r.returncode)


def curl(srv, path, *opts, data=None):
    """(status, body bytes) of curl on path; data: a file to POST."""
    cmd = ["curl", "-sS", "-o", "-", "-w", "\n%{http_code}", "--max-time", "60",
           "-H", "Content-Type: application/json"]
    if data is not None:
        cmd += ["--data-binary", "@" + data]
    r = subprocess.run(cmd + list(opts) + ["http://127.0.0.1:%d%s" % (srv.port, path)],
                       capture_output=True, timeout=120)
    body, _, code = r.stdout.rpartition(b"\n")
    check(r.returncode == 0, "curl %s %s runs (exit %d: %s)" % (path, " ".join(opts),
                                                                r.returncode, r.stderr[:200]))
    return int(code or 0), body


def test_curl(srv):
    if not shutil.which("curl"):
        print("SKIP: curl not found (deploy/install-deps.sh installs it)", flush=True)
        return
    key = ("-H", "Authorization: Bearer " + KEY)
    with tempfile.TemporaryDirectory() as d:
        bad = os.path.join(d, "bad.json")
        with open(bad, "w") as f:
            f.write('{"prompt": "ROMEO:", "max_tokens": ')
        s, b = curl(srv, "/v1/completions", *key, data=bad)
        ts.error_object(s, b, 400, "curl: bad JSON")
        ts.healthy(srv, "curl: bad JSON")
        good = os.path.join(d, "good.json")
        with open(good, "w") as f:
            json.dump(BODY, f)
        s, b = curl(srv, "/v1/completions", data=good)
        ts.error_object(s, b, 401, "curl: no API key", code="invalid_api_key")
        s, b = curl(srv, "/v1/chat/completions", "-H", "Authorization: Bearer nope", data=good)
        ts.error_object(s, b, 401, "curl: a wrong API key", code="invalid_api_key")
        s, b = curl(srv, "/v1/completions", *key, data=good)
        check(s == 200 and json.loads(b)["choices"][0]["text"], "curl: the key: 200")
        s, b = curl(srv, "/v1/models", *key, "-H", "Host: rebind.example:%d" % srv.port)
        ts.error_object(s, b, 403, "curl: a foreign Host header")
        ts.healthy(srv, "curl: a foreign Host header")
        s, b = curl(srv, "/v1/embeddings", *key, data=good)
        ts.error_object(s, b, 404, "curl: an unknown path")
        ts.healthy(srv, "curl: an unknown path")
        big = os.path.join(d, "big.json")
        with open(big, "w") as f:
            f.write('{"prompt": "' + "x" * (10 << 20) + '"}')
        s, b = curl(srv, "/v1/completions", *key, data=big)
        ts.error_object(s, b, 413, "curl: a 10 MB body", code="request_too_large")
        ts.healthy(srv, "curl: a 10 MB body")
        s, b = curl(srv, "/v1/completions", *key, data=good)
        check(s == 200 and json.loads(b)["choices"][0]["text"],
              "curl: a completion after the error cases")


def curl_headers(srv, path, *opts):
    """(status, {lower-case header: value}) of curl on path."""
    r = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-D", "-", "--max-time", "60"] +
                       list(opts) + ["http://127.0.0.1:%d%s" % (srv.port, path)],
                       capture_output=True, text=True, timeout=120)
    check(r.returncode == 0, "curl %s runs (%s)" % (path, r.stderr[:200]))
    lines = r.stdout.replace("\r", "").split("\n")
    status = int(lines[0].split()[1]) if lines and len(lines[0].split()) > 1 else 0
    h = {}
    for line in lines[1:]:
        k, sep, v = line.partition(":")
        if sep:
            h[k.strip().lower()] = v.strip()
    return status, h


def test_curl_cors(srv):
    """A browser's preflight and request, as curl sends them."""
    if not shutil.which("curl"):
        print("SKIP: curl not found (deploy/install-deps.sh installs it)", flush=True)
        return
    pre = ("-X", "OPTIONS", "-H", "Access-Control-Request-Method: POST",
           "-H", "Access-Control-Request-Headers: authorization,content-type")
    s, h = curl_headers(srv, "/v1/chat/completions", "-H", "Origin: " + PAGE, *pre)
    check(s == 204 and h.get("access-control-allow-origin") == PAGE and
          h.get("vary") == "Origin" and "POST" in h.get("access-control-allow-methods", "") and
          {"authorization", "content-type"} <= {x.strip().lower() for x in h.get(
              "access-control-allow-headers", "").split(",")} and
          int(h.get("access-control-max-age", "0")) > 0,
          "curl: a preflight from the --cors origin, without the key: 204 with the CORS "
          "headers (%d %r)" % (s, h))
    with tempfile.TemporaryDirectory() as d:
        good = os.path.join(d, "good.json")
        with open(good, "w") as f:
            json.dump(BODY, f)
        s, h = curl_headers(srv, "/v1/completions", "-H", "Origin: " + PAGE, "-H",
                            "Authorization: Bearer " + KEY, "-H",
                            "Content-Type: application/json", "--data-binary", "@" + good)
        check(s == 200 and h.get("access-control-allow-origin") == PAGE and
              h.get("vary") == "Origin",
              "curl: a completion from the --cors origin carries its CORS headers (%r)" % h)
    s, h = curl_headers(srv, "/v1/chat/completions", "-H", "Origin: http://evil.example", *pre)
    check(s != 204 and not any(k.startswith("access-control-") for k in h),
          "curl: a preflight from another origin gets no CORS headers (%d %r)" % (s, h))


def idle_client(srv, payload, what, result):
    """Send payload, then nothing: record in result[what] the seconds until
    the server closes the connection (None: not within 150 s)."""
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=150)
    s.sendall(payload)
    t0 = time.time()
    try:
        while s.recv(4096):
            pass
        result[what] = time.time() - t0
    except ConnectionResetError:
        result[what] = time.time() - t0
    except socket.timeout:
        result[what] = None
    finally:
        s.close()


def start_idle_clients(srv):
    result = {}
    threads = []
    for what, payload in (
            ("part of the headers", b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"),
            ("headers, no body", b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                 b"Authorization: Bearer " + KEY.encode() + b"\r\n"
                                 b"Content-Type: application/json\r\nContent-Length: 200\r\n\r\n"
                                 b'{"prompt": ')):
        t = threading.Thread(target=idle_client, args=(srv, payload, what, result), daemon=True)
        t.start()
        threads.append(t)
    return threads, result


def finish_idle_clients(srv, threads, result):
    for t in threads:
        t.join(180)
    for what in ("part of the headers", "headers, no body"):
        secs = result.get(what)
        check(secs is not None, "a client that sends %s then nothing is closed by the server "
              "(after %s s)" % (what, secs and round(secs)))
    ts.healthy(srv, "the idle clients")


def test_stream_reads_nothing(srv):
    """A client opens a stream and never reads: others are served."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", srv.port))
    body = json.dumps({"prompt": "ROMEO:", "max_tokens": 10 ** 6, "temperature": 0,
                       "stream": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " +
              KEY.encode() + b"\r\nContent-Type: application/json\r\nContent-Length: " +
              str(len(body)).encode() + b"\r\n\r\n" + body)
    ts.healthy(srv, "a stream that is not read (at once)")
    serves(srv, "beside a stream that is not read")
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    t0 = time.time()
    st = 429
    while st == 429 and time.time() - t0 < 60:
        st, _, b = srv.post("/v1/chat/completions", chat, headers=AUTH)
        time.sleep(0.1 if st == 429 else 0)
    check(st == 200, "a chat request is served beside a stream that is not read (%d)" % st)
    s.close()
    serves(srv, "after the unread stream's client closed")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    a = ap.parse_args()
    shoal = os.path.abspath(a.shoal)
    with tempfile.NamedTemporaryFile("w", suffix=".key") as kf:
        kf.write(KEY + "\n")
        kf.flush()
        os.chmod(kf.name, 0o600)
        srv = ts.Server(shoal, "--api-key", kf.name, "--cors", PAGE)
        try:
            # the idle clients wait out the server's timeout while the rest runs
            threads, idle = start_idle_clients(srv)
            test_node(shoal, srv)
            test_curl(srv)
            test_curl_cors(srv)
            test_stream_reads_nothing(srv)
            finish_idle_clients(srv, threads, idle)
        finally:
            rc = srv.stop()
            check(rc == 0, "SIGTERM stops the server with status 0 (%d)" % rc)
    return ts.result.summary("test_clients")


if __name__ == "__main__":
    sys.exit(main())
