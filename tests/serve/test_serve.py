#!/usr/bin/env python3
"""shoal serve: the OpenAI-compatible HTTP API, driven with the standard
library only (http.client, subprocess) on the bundled model.

  - /health and /v1/models
  - a greedy /v1/completions gives shoal run --greedy's text; streamed, the
    same text in chunks ending in data: [DONE]; stop strings; usage counts
  - /v1/chat/completions (whole and streamed) gives shoal run's continuation
    of the prompt the chat template renders
  - errors in OpenAI's shape: bad JSON / wrong types 400, context too long
    400 naming the limit, body over 1 MiB 413, unknown path 404, a foreign
    Host header 403, missing or wrong API key 401, a second request while one
    generates 429 with Retry-After; the server keeps serving after each
  - a client that disconnects cancels its generation
  - --host off loopback without --api-key is refused
  - the API's edges (issue 28): an assistant message with tool_calls and
    content null or left out is served (rendered as the template takes it:
    none for DeepSeek-V3's template, which tests `content is none`, when
    ../shared is there; "" for the bundled one, which adds strings); any
    other null content is a 400 naming messages[i].content; a role OpenAI
    does not know is a 400 naming messages[i].role; completions echo: true
    and response_format json_object/json_schema are 400s naming the
    parameter; GET /v1/models/ID gives the model object (an unknown id 404
    model_not_found); usage.prompt_tokens_details.cached_tokens reports the
    prompt tokens found in the KV cache (a repeated prompt, and after a
    restart with --slot-dir, whole and streamed); --cors ORIGINS answers an
    allowed Origin with Access-Control-Allow-Origin and Vary: Origin and its
    preflights with 204 without a key, a disallowed one without CORS
    headers; a bad --cors value is a one-line usage error

usage: test_serve.py --shoal build-test/coordinator/shoal
"""
import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness as H  # noqa: E402
MODEL = os.path.join(ROOT, "models", "shakespeare-moe")
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data")
result = H.Results(quiet=True)   # "FAIL: what" lines, "test_serve: N checks, M failed"
check = result.check
Server = H.Server                  # shoal serve on a free port, its stderr in .log()


def shoal_run(shoal, prompt, max_tokens, *extra, greedy=True, model=MODEL):
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    r = subprocess.run([shoal, "run", "--model", model, "--no-echo", "--prompt", prompt,
                        "--max-tokens", str(max_tokens), "--threads", "2", *extra] +
                       (["--greedy"] if greedy else []),
                       capture_output=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    assert out.endswith("\n")
    return out[:-1]   # the newline before the timings line


def sse_events(body):
    """The data: payloads of an SSE body, in order."""
    text = body.decode()
    check(text.endswith("data: [DONE]\n\n"), "the stream ends with data: [DONE]")
    events = [e for e in text.split("\n\n") if e]
    out = []
    for e in events:
        check(e.startswith("data: "), "every event is a data: line (%r)" % e[:40])
        out.append(e[6:])
    return out


def error_object(status, body, want_status, what, param=None, code=None):
    check(status == want_status, "%s: status %d, expected %d" % (what, status, want_status))
    try:
        e = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        check(False, "%s: the body is an OpenAI error object (%r)" % (what, body[:200]))
        return None
    check(isinstance(e.get("message"), str) and e["message"], what + ": error.message")
    check(isinstance(e.get("type"), str), what + ": error.type")
    check("param" in e and "code" in e, what + ": error.param and error.code present")
    if param is not None:
        check(e.get("param") == param, "%s: param %r, expected %r" % (what, e.get("param"), param))
    if code is not None:
        check(e.get("code") == code, "%s: code %r, expected %r" % (what, e.get("code"), code))
    return e


def healthy(srv, what):
    s, _, b = srv.request("GET", "/health")
    check(s == 200 and json.loads(b) == {"status": "ok"}, "serving after " + what)


def test_basics(shoal, srv):
    s, h, b = srv.request("GET", "/health")
    check(s == 200 and json.loads(b) == {"status": "ok"}, "/health")
    check("access-control-allow-origin" not in h, "no CORS header")
    s, h, _ = srv.request("OPTIONS", "/v1/completions", headers={
        "Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST"})
    check(s != 204 and not any(k.startswith("access-control-") for k in h),
          "without --cors, a preflight gets no CORS headers (%d %r)" % (s, h))
    s, _, b = srv.request("GET", "/v1/models")
    m = json.loads(b)
    check(s == 200 and m["object"] == "list" and [d["id"] for d in m["data"]] == ["shakespeare-moe"],
          "/v1/models lists the model: %r" % m)


def test_completions(shoal, srv):
    for prompt, n in (("ROMEO:", 40), ("To be, or not to be", 25)):
        want = shoal_run(shoal, prompt, n)
        s, h, b = srv.post("/v1/completions", {"model": "shakespeare-moe", "prompt": prompt,
                                               "max_tokens": n, "temperature": 0,
                                               "unknown_field": [1, 2]})
        check(s == 200 and h.get("content-type") == "application/json", "completions 200")
        r = json.loads(b)
        c = r["choices"][0]
        check(r["object"] == "text_completion" and r["id"].startswith("cmpl-"), "completion shape")
        check(c["text"] == want, "greedy completion equals shoal run --greedy for %r:\n%r\n%r"
              % (prompt, c["text"], want))
        check(c["finish_reason"] == "length", "finish_reason length at max_tokens")
        u = r["usage"]
        check(u["completion_tokens"] == n and u["total_tokens"] == u["prompt_tokens"] + n
              and u["prompt_tokens"] >= 1, "usage counts %r" % u)
        # streamed: the same text in chunks
        s, h, b = srv.post("/v1/completions", {"prompt": prompt, "max_tokens": n,
                                               "temperature": 0, "stream": True})
        check(s == 200 and h.get("content-type", "").startswith("text/event-stream"),
              "stream content type")
        ev = sse_events(b)
        chunks = [json.loads(e) for e in ev[:-1]]
        text = "".join(ch["choices"][0]["text"] for ch in chunks)
        check(text == want, "streamed text equals shoal run's: %r" % text)
        check(len(chunks) > 5, "streamed in many chunks (%d)" % len(chunks))
        check(chunks[-1]["choices"][0]["finish_reason"] == "length" and
              all(ch["choices"][0]["finish_reason"] is None for ch in chunks[:-1]),
              "only the last chunk has a finish_reason")
        check(ev[-1] == "[DONE]", "last event [DONE]")
    # stop strings: the text up to the stop string, finish_reason stop
    want = shoal_run(shoal, "ROMEO:", 60)
    cut = want.find("\n\n")
    check(cut > 0, "the reference holds a blank line to stop at")
    for stream in (False, True):
        s, _, b = srv.post("/v1/completions", {"prompt": "ROMEO:", "max_tokens": 60,
                                               "temperature": 0, "stop": ["\n\n", "zzzz"],
                                               "stream": stream})
        if stream:
            chunks = [json.loads(e) for e in sse_events(b)[:-1]]
            text = "".join(ch["choices"][0]["text"] for ch in chunks)
            fin = chunks[-1]["choices"][0]["finish_reason"]
        else:
            text = json.loads(b)["choices"][0]["text"]
            fin = json.loads(b)["choices"][0]["finish_reason"]
        check(s == 200 and text == want[:cut], "stop string cuts the text (stream=%s): %r"
              % (stream, text))
        check(fin == "stop", "finish_reason stop at a stop string (stream=%s)" % stream)
    # a seeded sampled request repeats itself
    body = {"prompt": "ROMEO:", "max_tokens": 20, "temperature": 0.9, "top_p": 0.9,
            "top_k": 30, "min_p": 0.01, "seed": 7}
    a = json.loads(srv.post("/v1/completions", body)[2])["choices"][0]["text"]
    b2 = json.loads(srv.post("/v1/completions", body)[2])["choices"][0]["text"]
    check(a == b2 and a, "the same seed gives the same sampled text")
    want_s = shoal_run(shoal, "ROMEO:", 20, "--temp", "0.9", "--top-p", "0.9", "--top-k", "30",
                       "--min-p", "0.01", "--seed", "7", greedy=False)
    check(a == want_s, "seeded sampling equals shoal run with the same knobs:\n%r\n%r"
          % (a, want_s))


def test_chat(shoal, srv):
    msgs = [{"role": "system", "content": "You are a poet."},
            {"role": "user", "content": "Speak of the moon."}]
    rendered = ("<|im_start|>system\nYou are a poet.<|im_end|>\n<|im_start|>user\n"
                "Speak of the moon.<|im_end|>\n<|im_start|>assistant\n")
    want = shoal_run(shoal, rendered, 30, "--no-bos")
    s, _, b = srv.post("/v1/chat/completions", {"model": "shakespeare-moe", "messages": msgs,
                                                "max_completion_tokens": 30, "temperature": 0})
    r = json.loads(b)
    check(s == 200 and r["object"] == "chat.completion" and r["id"].startswith("chatcmpl-"),
          "chat shape")
    c = r["choices"][0]
    content = c["message"]["content"]
    check(c["message"]["role"] == "assistant", "chat reply role")
    if c["finish_reason"] == "length":
        check(content == want, "chat reply equals shoal run on the rendered "
              "prompt:\n%r\n%r" % (content, want))
    else:   # an empty reply is a prefix of anything: not enough
        check(c["finish_reason"] == "stop" and content and want.startswith(content),
              "chat reply (stopped: %r) is a non-empty prefix of shoal run's:\n%r\n%r"
              % (c["finish_reason"], content, want))
    # content as a list of text parts: the same prompt
    parts = [msgs[0], {"role": "user", "content": [{"type": "text", "text": "Speak of "},
                                                    {"type": "text", "text": "the moon."}]}]
    s, h, b = srv.post("/v1/chat/completions", {"messages": parts, "max_tokens": 30,
                                                "temperature": 0, "stream": True,
                                                "stream_options": {"include_usage": True}})
    ev = sse_events(b)
    chunks = [json.loads(e) for e in ev[:-1]]
    check(chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""},
          "first chat chunk carries the role")
    check(all(ch["object"] == "chat.completion.chunk" for ch in chunks), "chunk objects")
    check(chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] ==
          r["usage"]["completion_tokens"] and chunks[-1]["usage"]["prompt_tokens"] ==
          r["usage"]["prompt_tokens"], "usage chunk at the end of the stream")
    text = "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks[:-1])
    check(text == c["message"]["content"], "streamed chat equals the whole reply: %r" % text)


def test_errors(shoal, srv):
    s, _, b = srv.post("/v1/completions", None, raw='{"prompt": "x",')
    error_object(s, b, 400, "bad JSON")
    healthy(srv, "bad JSON")
    s, _, b = srv.post("/v1/completions", None, raw=b'{"prompt": "\xff\xfe"}')
    error_object(s, b, 400, "invalid UTF-8")
    s, _, b = srv.post("/v1/completions", {"prompt": "x", "max_tokens": "ten"})
    error_object(s, b, 400, "max_tokens of the wrong type", param="max_tokens")
    s, _, b = srv.post("/v1/completions", {"prompt": "x", "temperature": -1})
    error_object(s, b, 400, "temperature out of range", param="temperature")
    s, _, b = srv.post("/v1/completions", {"max_tokens": 3})
    error_object(s, b, 400, "no prompt", param="prompt")
    s, _, b = srv.post("/v1/chat/completions", {"messages": [{"content": "hi"}]})
    error_object(s, b, 400, "a message without a role", param="messages[0].role")
    s, _, b = srv.post("/v1/completions", [1, 2])
    error_object(s, b, 400, "a body that is not an object")
    healthy(srv, "wrong types")
    # context too long: the bundled model holds 256 tokens
    s, _, b = srv.post("/v1/completions", {"prompt": "ROMEO: " * 300, "max_tokens": 3})
    e = error_object(s, b, 400, "context too long", code="context_length_exceeded")
    check(e is not None and "256" in e["message"], "the context error names the limit: %r"
          % (e and e["message"]))
    healthy(srv, "context too long")
    # a huge max_tokens is capped by the context, not refused
    s, _, b = srv.post("/v1/completions", {"prompt": "ROMEO:", "max_tokens": 10 ** 9,
                                           "temperature": 0, "stop": "\n\n"})
    check(s == 200, "a huge max_tokens is served (capped by the context)")
    # bodies over 1 MiB: 413
    big = json.dumps({"prompt": "x" * (2 << 20)})
    try:
        s, _, b = srv.post("/v1/completions", None, raw=big)
        error_object(s, b, 413, "a 2 MiB body")
    except (BrokenPipeError, ConnectionResetError):
        check(False, "a 2 MiB body gets a 413 answer, not a reset")
    healthy(srv, "a 2 MiB body")
    s, _, b = srv.request("GET", "/v1/nothing")
    error_object(s, b, 404, "unknown path")
    for path, body in (("/v1/completions", {"model": "gpt-4o", "prompt": "x"}),
                       ("/v1/chat/completions",
                        {"model": "llama", "messages": [{"role": "user", "content": "x"}]})):
        s, _, b = srv.post(path, body)
        error_object(s, b, 404, "an unknown model on " + path, param="model",
                     code="model_not_found")
    healthy(srv, "unknown models")
    s, _, b = srv.request("GET", "/v1/completions")
    error_object(s, b, 405, "GET on a POST endpoint")
    # DNS rebinding: a foreign Host header is refused
    c = srv.conn()
    c.putrequest("GET", "/v1/models", skip_host=True)
    c.putheader("Host", "evil.example:%d" % srv.port)
    c.endheaders()
    r = c.getresponse()
    error_object(r.status, r.read(), 403, "a foreign Host header")
    c.close()
    for host in ("localhost:%d" % srv.port, "[::1]:%d" % srv.port):
        c = srv.conn()
        c.putrequest("GET", "/health", skip_host=True)
        c.putheader("Host", host)
        c.endheaders()
        r = c.getresponse()
        r.read()
        check(r.status == 200, "Host %s is accepted" % host)
        c.close()
    healthy(srv, "the error cases")


CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}


def tool_conversation(content=None, leave_out=False):
    """A user turn, the assistant's tool call (its content given, null or
    left out), the tool's answer."""
    call = {"role": "assistant", "tool_calls": [CALL]}
    if not leave_out:
        call["content"] = content
    return [{"role": "user", "content": "Weather in Paris?"}, call,
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]


def test_messages_checked(srv):
    """Items 4 and 5: content null on an assistant's tool call is served;
    other null contents and unknown roles are 400s naming the field."""
    usage = {}
    for what, msgs in (("content \"\"", tool_conversation("")),
                       ("content null", tool_conversation(None)),
                       ("content left out", tool_conversation(leave_out=True))):
        s, _, b = srv.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 2,
                                                    "temperature": 0})
        check(s == 200, "an assistant tool call with %s is served (%d %r)" % (what, s, b[:300]))
        if s == 200:
            usage[what] = json.loads(b)["usage"]["prompt_tokens"]
    # the bundled template adds strings ('...' + message['content']): none as ""
    check(len(set(usage.values())) == 1 and len(usage) == 3,
          "content null or left out renders as \"\" in the bundled template (%r)" % usage)
    msgs = tool_conversation(None)
    msgs[2]["content"] = None
    s, _, b = srv.post("/v1/chat/completions", {"messages": msgs})
    e = error_object(s, b, 400, "a tool message with content null", param="messages[2].content")
    msg = (e or {}).get("message", "")
    check("messages[2].content is null" in msg and "unsupported operand" not in msg,
          "the 400 says which content is null, not the template's internals: %r" % msg)
    s, _, b = srv.post("/v1/chat/completions", {"messages": [{"role": "user"}]})
    e = error_object(s, b, 400, "a user message without content", param="messages[0].content")
    check("missing" in (e or {}).get("message", ""), "the 400 says the content is missing: %r"
          % (e or {}).get("message"))
    s, _, b = srv.post("/v1/chat/completions", {"messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": None}]})
    error_object(s, b, 400, "an assistant message with content null and no tool_calls",
                 param="messages[1].content")
    s, _, b = srv.post("/v1/chat/completions", {"messages": [{"role": "wizard",
                                                              "content": "hi"}]})
    e = error_object(s, b, 400, "role wizard", param="messages[0].role")
    msg = (e or {}).get("message", "")
    check("'wizard'" in msg and "'assistant'" in msg and "'developer'" in msg,
          "the 400 names the role and the roles accepted: %r" % msg)
    for role in ("system", "developer", "user"):
        s, _, b = srv.post("/v1/chat/completions", {"messages": [{"role": role,
                                                                  "content": "hi"}],
                                                    "max_tokens": 1})
        check(s == 200, "role %s is accepted (%d %r)" % (role, s, b[:200]))
    healthy(srv, "the message checks")


def test_refused_params(srv):
    """Item 6: what the server cannot do yet is refused, not ignored."""
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    s, _, b = srv.post("/v1/completions", {"prompt": "ROMEO:", "max_tokens": 2, "echo": True})
    e = error_object(s, b, 400, "completions echo: true", param="echo")
    check("echo" in (e or {}).get("message", ""), "the echo 400 names it: %r" % (e or {}))
    for rf in ({"type": "json_object"},
               {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}):
        s, _, b = srv.post("/v1/chat/completions", dict(chat, response_format=rf))
        e = error_object(s, b, 400, "response_format " + rf["type"], param="response_format")
        check(rf["type"] in (e or {}).get("message", ""),
              "the response_format 400 names the type: %r" % (e or {}).get("message"))
    s, _, b = srv.post("/v1/chat/completions", dict(chat, response_format={"type": "text"}))
    check(s == 200, "response_format text is served (%d)" % s)
    s, _, b = srv.post("/v1/completions", {"prompt": "ROMEO:", "max_tokens": 2, "echo": False})
    check(s == 200, "echo: false is served (%d)" % s)
    healthy(srv, "the refused parameters")


def cached_of(usage):
    return ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")


def logged_cached(srv):
    return [int(m) for m in re.findall(r"tokens \((\d+) cached\)", srv.log())]


def test_model_and_cached(srv):
    """Item 7: GET /v1/models/ID; cached_tokens of a repeated prompt."""
    s, _, b = srv.request("GET", "/v1/models")
    listed = json.loads(b)["data"][0]
    s, h, b = srv.request("GET", "/v1/models/shakespeare-moe")
    check(s == 200 and h.get("content-type") == "application/json" and json.loads(b) == listed,
          "GET /v1/models/shakespeare-moe is the listed model object (%d %r, %r)" %
          (s, b[:200], listed))
    s, _, b = srv.request("GET", "/v1/models/gpt-4o")
    e = error_object(s, b, 404, "an unknown model id", param="model", code="model_not_found")
    check("'gpt-4o'" in (e or {}).get("message", ""), "the 404 names the id: %r" % (e or {}))
    s, _, b = srv.request("POST", "/v1/models/shakespeare-moe", {})
    error_object(s, b, 405, "POST on /v1/models/ID")
    prompt = "ROMEO: " + "But soft, what light through yonder window breaks? " * 2
    first = json.loads(srv.post("/v1/completions", {"prompt": prompt, "max_tokens": 2})[2])
    check(cached_of(first["usage"]) is not None, "usage holds prompt_tokens_details."
          "cached_tokens: %r" % first["usage"])
    again = json.loads(srv.post("/v1/completions", {"prompt": prompt, "max_tokens": 2})[2])
    n = cached_of(again["usage"])
    check(n is not None and n >= 10 and n < again["usage"]["prompt_tokens"] and
          n == logged_cached(srv)[-1],
          "a repeated prompt: cached_tokens %r, as the log says (%r), of %d" %
          (n, logged_cached(srv)[-3:], again["usage"]["prompt_tokens"]))
    s, _, b = srv.post("/v1/completions", {"prompt": prompt, "max_tokens": 2, "stream": True,
                                           "stream_options": {"include_usage": True}})
    u = json.loads(sse_events(b)[-2]).get("usage")
    n = cached_of(u)
    check(n is not None and n >= 10 and n == logged_cached(srv)[-1],
          "streamed: the usage chunk's cached_tokens %r as the log's %r" %
          (n, logged_cached(srv)[-1:]))


def test_cached_after_restart(shoal, tmp):
    """Item 7: a prompt a restarted server (--slot-dir) finds in the saved
    slots reports cached_tokens, whole and streamed chat."""
    body = {"messages": [{"role": "user", "content": "Speak of the moon and the stars."}],
            "max_tokens": 4, "temperature": 0}
    srv = Server(shoal, "--parallel", "2", "--slot-dir", tmp)
    try:
        s, _, b = srv.post("/v1/chat/completions", body)
        check(s == 200 and cached_of(json.loads(b)["usage"]) == 0,
              "a first prompt has no cached tokens: %r" % b[-200:])
    finally:
        check(srv.stop() == 0, "--slot-dir: the first server exits 0")
    srv = Server(shoal, "--parallel", "2", "--slot-dir", tmp)
    try:
        s, _, b = srv.post("/v1/chat/completions", body)
        u = json.loads(b)["usage"] if s == 200 else {}
        n = cached_of(u)
        check(n is not None and n >= 10 and logged_cached(srv) == [n],
              "after a restart with --slot-dir: cached_tokens %r, as the log says (%r)" %
              (n, logged_cached(srv)))
        s, _, b = srv.post("/v1/chat/completions",
                           dict(body, stream=True, stream_options={"include_usage": True}))
        u = json.loads(sse_events(b)[-2]).get("usage")
        check(cached_of(u) is not None and cached_of(u) >= 10 and
              cached_of(u) == logged_cached(srv)[-1],
              "streamed chat: the usage chunk's cached_tokens %r" % (u,))
    finally:
        check(srv.stop() == 0, "--slot-dir: the second server exits 0")


def cors_request(srv, method, path, origin, body=None, headers=None):
    h = {"Origin": origin} if origin else {}
    h.update(headers or {})
    return srv.request(method, path, body, headers=h)


def test_cors(shoal):
    """Item 8: --cors, with an API key (a preflight needs none)."""
    page, other = "http://localhost:3000", "http://evil.example"
    with tempfile.NamedTemporaryFile("w", suffix=".key") as kf:
        kf.write("a-secret-key-of-some-length\n")
        kf.flush()
        os.chmod(kf.name, 0o600)
        auth = {"Authorization": "Bearer a-secret-key-of-some-length"}
        srv = Server(shoal, "--api-key", kf.name, "--cors", page + ",https://app.example:8443")
        try:
            pre = {"Access-Control-Request-Method": "POST",
                   "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"}
            s, h, b = cors_request(srv, "OPTIONS", "/v1/chat/completions", page, headers=pre)
            check(s == 204 and b == b"", "a preflight from an allowed origin: 204 without a key "
                  "(%d %r)" % (s, b[:200]))
            check(h.get("access-control-allow-origin") == page and h.get("vary") == "Origin",
                  "the preflight allows the origin, Vary: Origin (%r)" % h)
            methods = [m.strip() for m in h.get("access-control-allow-methods", "").split(",")]
            allowed = [x.strip().lower()
                       for x in h.get("access-control-allow-headers", "").split(",")]
            check("POST" in methods and "GET" in methods, "Allow-Methods %r" % methods)
            check({"authorization", "content-type", "x-stainless-os"} <= set(allowed),
                  "Allow-Headers holds Authorization, Content-Type and the asked ones: %r" %
                  allowed)
            check(int(h.get("access-control-max-age", "0")) > 0, "Max-Age %r" %
                  h.get("access-control-max-age"))
            s, h, b = cors_request(srv, "OPTIONS", "/v1/models", "HTTPS://App.Example:8443")
            check(s == 204 and h.get("access-control-allow-origin") == "HTTPS://App.Example:8443",
                  "the second origin, in other case: 204 and allowed (%d %r)" % (s, h))
            body = {"prompt": "ROMEO:", "max_tokens": 2, "temperature": 0}
            s, h, b = cors_request(srv, "POST", "/v1/completions", page, body, auth)
            check(s == 200 and h.get("access-control-allow-origin") == page and
                  h.get("vary") == "Origin", "a completion for an allowed origin carries "
                  "Access-Control-Allow-Origin and Vary (%d %r)" % (s, h))
            s, h, b = cors_request(srv, "POST", "/v1/completions", page,
                                   dict(body, stream=True), auth)
            check(s == 200 and h.get("access-control-allow-origin") == page,
                  "a stream for an allowed origin carries Access-Control-Allow-Origin (%r)" % h)
            s, h, b = cors_request(srv, "POST", "/v1/completions", page, body)
            error_object(s, b, 401, "an allowed origin without the key")
            check(h.get("access-control-allow-origin") == page,
                  "the 401 carries the CORS header, so the page can read it (%r)" % h)
            s, h, b = cors_request(srv, "GET", "/v1/models", page, headers=auth)
            check(s == 200 and h.get("access-control-allow-origin") == page, "/v1/models")
            # a disallowed origin: no CORS header anywhere, no preflight answer
            s, h, b = cors_request(srv, "OPTIONS", "/v1/chat/completions", other, headers=pre)
            check(s != 204 and not any(k.startswith("access-control-") for k in h),
                  "a preflight from another origin gets no CORS headers (%d %r)" % (s, h))
            s, h, b = cors_request(srv, "POST", "/v1/completions", other, body, auth)
            check(s == 200 and not any(k.startswith("access-control-") for k in h),
                  "a request from another origin: served, no CORS headers (%r)" % h)
            s, h, b = cors_request(srv, "POST", "/v1/completions", None, body, auth)
            check(s == 200 and "access-control-allow-origin" not in h, "no Origin, no CORS")
        finally:
            check(srv.stop() == 0, "--cors: exits 0")
    srv = Server(shoal, "--cors", "*")
    try:
        s, h, b = cors_request(srv, "OPTIONS", "/v1/completions", other)
        check(s == 204 and h.get("access-control-allow-origin") == other,
              "--cors '*': any origin is allowed (%d %r)" % (s, h))
    finally:
        check(srv.stop() == 0, "--cors '*': exits 0")
    for bad in ("", "localhost:3000", "http://localhost:3000/", "http://a.example,,http://b",
                "http://host:99999", "ftp://x"):
        r = subprocess.run([shoal, "serve", "--port", "0", "--cors", bad],
                           capture_output=True, text=True, timeout=60)
        lines = r.stderr.strip().split("\n")
        check(r.returncode == 2 and len(lines) == 1 and "--cors" in lines[0] and
              "expected" in lines[0], "--cors %r: one usage line, exit 2 (%d %r)" %
              (bad, r.returncode, r.stderr))


def test_tool_call_template(shoal, tmp):
    """Item 4 against a template that reads tool calls: DeepSeek-V3's tests
    `message['content'] is none` to render an assistant's tool call. The
    bundled model with that template: prompt_tokens equals jinja2's
    rendering with content None (not with "")."""
    cfg_path = os.path.join(SHARED, "tokenizers", "DeepSeek-V3-Base.tokenizer_config.json")
    if not os.path.exists(cfg_path):
        print("SKIP tool-call template: ../shared/data (DeepSeek-V3's chat template) is "
              "absent", flush=True)
        return
    try:
        import jinja2.sandbox
    except ImportError:
        print("SKIP tool-call template: python3-jinja2 is not installed", flush=True)
        return
    with open(cfg_path) as f:
        template = json.load(f)["chat_template"]
    model = os.path.join(tmp, "deepseek-template")
    os.makedirs(model)
    for name in os.listdir(MODEL):
        if name != "tokenizer_config.json":
            os.symlink(os.path.join(MODEL, name), os.path.join(model, name))
    with open(os.path.join(MODEL, "tokenizer_config.json")) as f:
        cfg = json.load(f)
    cfg["chat_template"] = template
    with open(os.path.join(model, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f)
    bos = cfg.get("bos_token") or ""
    bos = bos.get("content", "") if isinstance(bos, dict) else bos
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def n_tokens(msgs):
        text = env.from_string(template).render(messages=msgs, bos_token=bos,
                                                add_generation_prompt=True)
        r = subprocess.run([shoal, "tokenize", "--model", model, "--no-bos", "--parse-special",
                            "--text", text], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return len(r.stdout.split())

    want_none = n_tokens(tool_conversation(None))
    want_empty = n_tokens(tool_conversation(""))
    check(want_none != want_empty, "DeepSeek-V3's template renders none and \"\" apart")
    srv = Server(shoal, model=model)
    try:
        for what, msgs in (("null", tool_conversation(None)),
                           ("left out", tool_conversation(leave_out=True))):
            s, _, b = srv.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 1})
            got = json.loads(b)["usage"]["prompt_tokens"] if s == 200 else None
            check(got == want_none, "DeepSeek-V3's template, content %s: prompt_tokens %r == "
                  "jinja2's rendering with None, %d (with \"\": %d; %d %r)" %
                  (what, got, want_none, want_empty, s, b[:200]))
    finally:
        check(srv.stop() == 0, "the DeepSeek-template server exits 0")


def test_key_busy_cancel(shoal):
    with tempfile.NamedTemporaryFile("w", suffix=".key") as kf:
        kf.write("a-secret-key-of-some-length\n")
        kf.flush()
        os.chmod(kf.name, 0o600)
        srv = Server(shoal, "--api-key", kf.name, "--test-token-delay", "30",
                     "--parallel", "1", "--queue", "0")
        try:
            body = {"prompt": "ROMEO:", "max_tokens": 2, "temperature": 0}
            s, _, b = srv.post("/v1/completions", body)
            error_object(s, b, 401, "no API key", code="invalid_api_key")
            s, _, b = srv.post("/v1/completions", body,
                               headers={"Authorization": "Bearer a-secret-key-of-some-lengtH"})
            error_object(s, b, 401, "a wrong API key", code="invalid_api_key")
            s, _, b = srv.request("GET", "/v1/models")
            error_object(s, b, 401, "/v1/models without the key")
            auth = {"Authorization": "Bearer a-secret-key-of-some-length"}
            s, _, b = srv.post("/v1/completions", body, headers=auth)
            check(s == 200 and json.loads(b)["choices"][0]["text"], "the right API key: 200")
            healthy(srv, "key errors (/health needs no key)")
            # --parallel 1 --queue 0: a second request meanwhile gets 429
            c = srv.conn()
            c.request("POST", "/v1/completions", body=json.dumps(
                {"prompt": "ROMEO:", "max_tokens": 200, "temperature": 0, "stream": True,
                 "ignore": True}), headers=dict(auth, **{"Content-Type": "application/json"}))
            r = c.getresponse()
            check(r.status == 200, "the long stream starts")
            first = r.readline()
            check(first.startswith(b"data: "), "the first event arrives: %r" % first)
            s, h, b = srv.post("/v1/completions", body, headers=auth)
            error_object(s, b, 429, "a second request while one generates (--parallel 1, --queue 0)")
            check(h.get("retry-after") == "1", "429 carries Retry-After: %r" % h.get("retry-after"))
            s, h, b = srv.post("/v1/chat/completions",
                               {"messages": [{"role": "user", "content": "hi"}]}, headers=auth)
            error_object(s, b, 429, "a chat request while one generates")
            healthy(srv, "429")
            # the client goes away: its generation stops well before 200 tokens
            c.sock.shutdown(socket.SHUT_RDWR)
            c.close()
            t0 = time.time()
            ok = False
            while time.time() - t0 < 20:
                s, _, b = srv.post("/v1/completions", body, headers=auth)
                if s == 200:
                    ok = True
                    break
                time.sleep(0.1)
            check(ok, "the server serves again once the client left")
            m = re.findall(r"decode (\d+) tokens.*stop: interrupted", srv.log())
            check(len(m) == 1 and int(m[0]) < 150,
                  "the disconnected stream was cancelled (log: %r)" % m)
            # a whole (non-streamed) request whose client leaves is cancelled too
            c = srv.conn()
            c.request("POST", "/v1/completions", body=json.dumps(
                {"prompt": "ROMEO:", "max_tokens": 200, "temperature": 0}),
                headers=dict(auth, **{"Content-Type": "application/json"}))
            time.sleep(0.5)
            c.sock.shutdown(socket.SHUT_RDWR)
            c.close()
            t0 = time.time()
            while time.time() - t0 < 20 and len(re.findall("stop: interrupted", srv.log())) < 2:
                time.sleep(0.1)
            m = re.findall(r"decode (\d+) tokens.*stop: interrupted", srv.log())
            check(len(m) == 2 and int(m[1]) < 150,
                  "a whole request whose client left was cancelled (log: %r)" % m)
            http = [ln for ln in srv.log().splitlines() if "shoal serve: http:" in ln]
            check(not http, "a client leaving puts no libmicrohttpd message in the log "
                  "(its request's line says 'interrupted'): %r" % http)
            healthy(srv, "disconnects")
        finally:
            rc = srv.stop()
            check(rc == 0, "SIGTERM stops the server with status 0 (%d)" % rc)
            check("shoal serve: stopping" in srv.log(), "the server says it stops")


def test_usage_errors(shoal):
    # a port in use: one line with libmicrohttpd's reason (it printed its own
    # line first, then shoal's without the reason)
    busy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    r = subprocess.run([shoal, "serve", "--port", str(port)], capture_output=True, text=True,
                       timeout=120)
    busy.close()
    err = r.stderr.strip().splitlines()
    err = [ln for ln in err if not ln.startswith("shoal: loaded")]
    check(r.returncode == 1 and len(err) == 1 and "cannot listen on 127.0.0.1:%d" % port in err[0]
          and "in use" in err[0], "a port in use: one line with the reason, exit 1: %r" % err)
    r = subprocess.run([shoal, "serve", "--host", "0.0.0.0", "--port", "0"],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 2 and "loopback" in r.stderr and "--api-key" in r.stderr,
          "--host off loopback without --api-key is refused: %r" % r.stderr)
    r = subprocess.run([shoal, "serve", "--help"], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0 and "/v1/chat/completions" in r.stdout, "serve --help")


def test_kv_budget(shoal):
    """--kv-budget: the slots' context is lowered to fit the bytes."""
    # the bundled model: 4 layers x 2 x 128 f32 = 4096 bytes per token
    srv = Server(shoal, "--parallel", "4", "--kv-budget", "1M")
    try:
        check("context 64 tokens x 4 slots, KV cache 1.0 MiB" in srv.log(),
              "--kv-budget 1M at --parallel 4: 64 tokens per slot (%r)" % srv.log()[-300:])
        s, _, b = srv.post("/v1/completions", {"prompt": "ROMEO: " * 40, "max_tokens": 2})
        e = error_object(s, b, 400, "a prompt over the budget's context",
                         code="context_length_exceeded")
        check(e is not None and "64 tokens" in e.get("message", ""),
              "the error names the 64-token context: %r" % (e or {}).get("message"))
        s, _, b = srv.post("/v1/completions", {"prompt": "ROMEO:", "max_tokens": 2})
        check(s == 200, "a short prompt is served within the budget")
    finally:
        check(srv.stop() == 0, "--kv-budget: exits 0")
    r = subprocess.run([shoal, "serve", "--port", "0", "--kv-budget", "10K"],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 2 and "--kv-budget" in r.stderr and "at least 2" in r.stderr,
          "--kv-budget below 2 tokens a slot: exit 2, one line (%d, %r)" % (r.returncode,
                                                                          r.stderr))


def test_nul_bytes(shoal):
    """A generated byte 0 (the bundled vocabulary's token 0) is text like any
    other: whole replies, chat content and logprobs carry it (it once cut
    whole replies at the first NUL)."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("72 0 414 0 111\n")   # H \0 ell \0 o
        forced = f.name
    srv = Server(shoal, "--test-forced-tokens", forced)
    try:
        s, _, b = srv.post("/v1/completions", {"prompt": "hi", "max_tokens": 5,
                                               "logprobs": 1})
        j = json.loads(b) if s == 200 else {}
        c = (j.get("choices") or [{}])[0]
        check(c.get("text") == "H\0ell\0o", "completions: the NUL bytes are in the text: %r" %
              b[:300])
        lp = c.get("logprobs") or {}
        check(lp.get("tokens") == ["H", "\0", "ell", "\0", "o"] and
              lp.get("text_offset") == [0, 1, 2, 5, 6],
              "completions logprobs: NUL tokens and their offsets: %r" % lp)
        # the forced (sampled) token is among its top_logprobs with its own
        # logprob, as OpenAI's completions give it (up to logprobs + 1 keys;
        # a key ends at a NUL)
        tops, lps = lp.get("top_logprobs") or [], lp.get("token_logprobs") or []
        check(len(tops) == 5 and len(lps) == 5 and
              all(len(t) <= 2 and t.get(tok.split("\0")[0]) == v
                  for tok, t, v in zip(lp.get("tokens") or [], tops, lps)),
              "completions logprobs: each sampled token in its top_logprobs: %r" % lp)
        s, _, b = srv.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
            "logprobs": True})
        j = json.loads(b) if s == 200 else {}
        c = (j.get("choices") or [{}])[0]
        check(c.get("message", {}).get("content") == "H\0ell\0o",
              "chat: the NUL bytes are in the content: %r" % b[:300])
        toks = (c.get("logprobs") or {}).get("content") or []
        check([t.get("bytes") for t in toks] == [[72], [0], [101, 108, 108], [0], [111]],
              "chat logprobs: a NUL token's bytes are [0]: %r" % toks)
        s, _, b = srv.post("/v1/completions", {"prompt": "hi", "max_tokens": 5,
                                               "stream": True})
        text = "".join(json.loads(e)["choices"][0]["text"] for e in sse_events(b)[:-1])
        check(text == "H\0ell\0o", "a stream carries the same text: %r" % text)
        # a stop string past a NUL byte is found (it was searched as a C string)
        s, _, b = srv.post("/v1/completions", {"prompt": "hi", "max_tokens": 5, "stop": "ell"})
        c = (json.loads(b).get("choices") or [{}])[0] if s == 200 else {}
        check(c.get("text") == "H\0" and c.get("finish_reason") == "stop",
              "a stop string after a NUL byte ends the text before it: %r" % b[:300])
    finally:
        check(srv.stop() == 0, "NUL bytes: exits 0")
        os.unlink(forced)


def test_stop_replies(shoal):
    """SIGTERM with requests running and queued: every client gets its reply
    (a partial 200 ending in finish_reason "length", or 503), none an empty
    or cut-off one (the daemon stopped before they were sent). While the
    stop waits for a half-sent request, every endpoint, /health included,
    answers 503."""
    srv = Server(shoal, "--parallel", "2", "--test-token-delay", "20")
    out = {}
    streaming = threading.Event()

    def whole(k):
        try:
            out[k] = srv.post("/v1/completions", {"prompt": "ROMEO:", "max_tokens": 200,
                                                  "temperature": 0})
        except Exception as e:   # noqa: BLE001 (an empty reply)
            out[k] = ("error", {}, repr(e).encode())

    def stream(k):
        try:
            c = srv.conn()
            c.request("POST", "/v1/completions", body=json.dumps(
                {"prompt": "ROMEO:", "max_tokens": 200, "stream": True}),
                headers={"Content-Type": "application/json"})
            r = c.getresponse()
            first = r.readline()
            if first.startswith(b"data: {"):
                streaming.set()
            out[k] = (r.status, {}, first + r.read())
            c.close()
        except Exception as e:   # noqa: BLE001 (a cut-off body)
            out[k] = ("error", {}, repr(e).encode())

    # a request whose body never completes holds the stop open (at most 10 s)
    held = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    held.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
    ts = [threading.Thread(target=stream, args=(k,)) for k in range(5, 8)]
    ts += [threading.Thread(target=whole, args=(k,)) for k in range(5)]
    for t in ts:
        t.start()
    check(streaming.wait(60), "a stream is generating before the stop")
    time.sleep(0.2)   # the whole requests are queued or running by now
    srv.p.terminate()
    health = None
    t0 = time.time()
    while time.time() - t0 < 8 and health != 503:
        try:
            health = srv.request("GET", "/health")[0]
        except Exception:   # noqa: BLE001 (not stopping yet, or gone)
            health = None
        time.sleep(0.05)
    check(health == 503, "while the stop waits, /health answers 503 (%r)" % health)
    for t in ts:
        t.join(60)
    held.close()
    try:
        rc = srv.p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        srv.p.kill()
        rc = srv.p.wait()
    check(rc == 0, "SIGTERM with 8 requests in flight: exit 0 (%d)" % rc)
    n_partial = 0
    for k in range(8):
        s, _, b = out.get(k, ("missing", {}, b""))
        if s == 503:
            e = json.loads(b).get("error", {})
            check(e.get("type") == "server_error" and "shutting down" in e.get("message", ""),
                  "request %d: 503 says the server is shutting down: %r" % (k, b[:200]))
        elif s == 200 and k < 5:
            j = json.loads(b)
            n_partial += 1
            check(j["choices"][0]["finish_reason"] == "length" and
                  j["usage"]["completion_tokens"] < 200,
                  "request %d: a running whole request ends early with 'length': %r" %
                  (k, b[:200]))
        elif s == 200:
            ev = sse_events(b)
            n_partial += 1
            check(ev and ev[-1] == "[DONE]" and any(
                '"finish_reason":"length"' in e.replace(" ", "") for e in ev),
                  "request %d: a running stream ends with 'length' and [DONE]" % k)
        else:
            check(False, "request %d got no reply at the stop: %r %r" % (k, s, b[:200]))
    check(n_partial >= 1, "at the stop, the running requests end with what they have "
          "(%d partial replies)" % n_partial)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    a = ap.parse_args()
    shoal = os.path.abspath(a.shoal)
    test_usage_errors(shoal)
    srv = Server(shoal)
    try:
        test_basics(shoal, srv)
        test_completions(shoal, srv)
        test_chat(shoal, srv)
        test_errors(shoal, srv)
        test_messages_checked(srv)
        test_refused_params(srv)
        test_model_and_cached(srv)
    finally:
        rc = srv.stop()
        check(rc == 0, "SIGTERM stops the server with status 0 (%d)" % rc)
    test_key_busy_cancel(shoal)
    test_kv_budget(shoal)
    test_stop_replies(shoal)
    test_nul_bytes(shoal)
    test_cors(shoal)
    with tempfile.TemporaryDirectory() as tmp:
        test_cached_after_restart(shoal, tmp)
    with tempfile.TemporaryDirectory() as tmp:
        test_tool_call_template(shoal, tmp)
    return result.summary("test_serve")


if __name__ == "__main__":
    sys.exit(main())
