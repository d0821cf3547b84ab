#!/usr/bin/env python3
"""shoal serve's GET /metrics and GET / (the live dashboard), on the bundled
model converted to a container (so the expert store has tiers to show),
with one shoal-worker beside the local store when --worker is given.

  - /metrics is Prometheus text (0.0.4): every sample line well-formed,
    every family with HELP and TYPE before its samples, no series twice;
    after known requests the counters moved by exactly what the clients
    saw (requests_total by endpoint and status, prompt and completion
    tokens equal to the sum of the usage fields, generations_total; engine
    steps, their rows and acquires); the
    expert acquires by tier match the dashboard's store counts, and the
    heat map's per-expert totals add up to acquires + worker runs
  - /v1/dashboard/events sends JSON snapshots as server-sent events
  - headless Chromium (Debian's chromium, driven over the DevTools
    protocol with python3-websocket) loads / while a request generates:
    the heat map has n_layer rows of n_expert cells with non-zero ones,
    coloured by tier (and by worker when there is one); the request table
    shows the running request (decode) and, later, the finished ones; the
    executors list shows the local store (and the worker); the time-per-step
    bar has parts and its legend names them (attention ...) with
    percentages, also for the bundled checkpoint, which has no expert store
    (issue 28: the timings were drawn only with a store). A screenshot
    goes to --screenshot (docs/dashboard.png is one).
  - with --api-key: /metrics and the event stream need the key, the page
    and /health do not, and the page connects with /#key=KEY
  - SIGTERM with a dashboard connected: the server exits 0

Skips (exit 0, saying why) the browser part when chromium or
python3-websocket is missing.

usage: test_dashboard.py --shoal build-test/coordinator/shoal
                         [--worker build-test/worker/shoal-worker]
                         [--screenshot docs/dashboard.png]
"""
import argparse
import base64
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "cluster"))
from test_serve import MODEL, Server, check, result  # noqa: E402
from clusterlib import Worker  # noqa: E402

N_LAYER, N_EXPERT = 4, 8   # models/shakespeare-moe/config.json
KEY = "dashboard-test-key-0123456789"

# ---- Prometheus text exposition ----

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|'
                    r'\\.)*"(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*")*)?\})? '
                    r'(-?[0-9.eE+-]+|NaN|[+-]Inf)$')


def parse_prometheus(text):
    """{(name, labels-string): value}; checks the format as it goes."""
    check(text.endswith("\n"), "/metrics ends with a newline")
    helps, types, series = set(), {}, {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            parts = line.split(" ", 3)
            check(len(parts) == 4 and parts[3], "HELP line has a text: %r" % line)
            helps.add(parts[2])
        elif line.startswith("# TYPE "):
            parts = line.split(" ")
            check(len(parts) == 4 and parts[3] in ("counter", "gauge", "histogram", "summary",
                                                   "untyped"), "TYPE line: %r" % line)
            types[parts[2]] = parts[3]
        elif line.startswith("#") or not line:
            check(False, "no other comments or blank lines: %r" % line)
        else:
            m = SAMPLE.match(line)
            check(m is not None, "a well-formed sample line: %r" % line)
            if not m:
                continue
            name, labels, value = m.group(1), m.group(2) or "", m.group(3)
            check(name in helps and name in types, "HELP and TYPE precede %s" % name)
            if types.get(name) == "counter":
                check(name.endswith("_total"), "counter %s ends in _total" % name)
            check((name, labels) not in series, "series %s%s once" % (name, labels))
            series[(name, labels)] = float(value)
    return series


def metric(series, name, **labels):
    want = ",".join('%s="%s"' % kv for kv in labels.items())
    total, found = 0.0, False
    for (n, l), v in series.items():
        if n != name:
            continue
        if all('%s="%s"' % kv in l for kv in labels.items()) or not want:
            total += v
            found = True
    return total if found else 0.0


def scrape(srv, headers=None):
    s, h, b = srv.request("GET", "/metrics", headers=headers)
    check(s == 200, "/metrics answers 200 (%d)" % s)
    check(h.get("content-type", "").startswith("text/plain; version=0.0.4"),
          "/metrics content type %r" % h.get("content-type"))
    return parse_prometheus(b.decode())


def events(srv, n, headers=None):
    """The first n JSON snapshots of /v1/dashboard/events."""
    c = srv.conn(timeout=30)
    c.request("GET", "/v1/dashboard/events", headers=headers or {})
    r = c.getresponse()
    check(r.status == 200, "/v1/dashboard/events answers 200 (%d)" % r.status)
    check(r.getheader("Content-Type") == "text/event-stream", "the event stream's type")
    out, buf = [], b""
    while len(out) < n:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            check(ev.startswith(b"data: "), "each event is one data: line")
            out.append(json.loads(ev[6:]))
    c.close()
    check(len(out) == n, "%d snapshots arrived (%d)" % (n, len(out)))
    return out


def complete(srv, prompt, max_tokens, stream=False, headers=None):
    """A greedy completion; returns its usage dict."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    s, _, b = srv.post("/v1/completions", body, headers=headers)
    check(s == 200, "completion %r: 200 (%d)" % (prompt, s))
    if not stream:
        return json.loads(b)["usage"]
    usage = None
    for ev in b.decode().split("\n\n"):
        if ev.startswith("data: {"):
            usage = json.loads(ev[6:]).get("usage") or usage
    return usage


def wait_for(pred, timeout, step=0.1):
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()


# ---- the test proper ----

def test_metrics(srv, cluster):
    before = scrape(srv)
    usages = [complete(srv, "ROMEO:", 12), complete(srv, "JULIET:", 9),
              complete(srv, "To be", 7, stream=True)]
    check(all(u and u["completion_tokens"] > 0 for u in usages), "usage in every response")
    s, _, _ = srv.post("/v1/completions", None, raw=b"{not json")
    check(s == 400, "bad JSON: 400")
    s, _, _ = srv.request("GET", "/no/such/path")
    check(s == 404, "unknown path: 404")
    # requests_total is counted when a connection's request completes, a
    # moment after the client has its response: wait for it
    def settled():
        m = scrape(srv)
        ok = metric(m, "shoal_requests_total", endpoint="/v1/completions", status="200") - \
            metric(before, "shoal_requests_total", endpoint="/v1/completions", status="200") >= 3
        return m if ok and metric(m, "shoal_requests_total", endpoint="other",
                                  status="404") >= 1 else None
    after = wait_for(settled, 10) or scrape(srv)

    def delta(name, **kw):
        return metric(after, name, **kw) - metric(before, name, **kw)
    check(delta("shoal_requests_total", endpoint="/v1/completions", status="200") == 3,
          "requests_total{/v1/completions,200} +3")
    check(delta("shoal_requests_total", endpoint="/v1/completions", status="400") == 1,
          "requests_total{/v1/completions,400} +1 (bad JSON)")
    check(delta("shoal_requests_total", endpoint="other", status="404") == 1,
          "requests_total{other,404} +1")
    check(delta("shoal_generations_total", endpoint="/v1/completions") == 3,
          "generations_total +3 (the bad JSON never reached the engine)")
    want_gen = sum(u["completion_tokens"] for u in usages)
    want_prompt = sum(u["prompt_tokens"] for u in usages)
    check(delta("shoal_completion_tokens_total") == want_gen,
          "completion_tokens_total +%d = the usage fields' sum (%g)"
          % (want_gen, delta("shoal_completion_tokens_total")))
    check(delta("shoal_prompt_tokens_total") == want_prompt,
          "prompt_tokens_total +%d = the usage fields' sum (%g)"
          % (want_prompt, delta("shoal_prompt_tokens_total")))
    check(metric(after, "shoal_requests_running") == 0 and
          metric(after, "shoal_requests_queued") == 0, "nothing running or queued after")
    acq = {t: metric(after, "shoal_expert_acquires_total", tier=t)
           for t in ("pinned", "cache", "disk")}
    check(all(v > 0 for v in acq.values()),
          "experts served by every tier (pinned, cache, disk): %s" % acq)
    check(metric(after, "shoal_expert_bytes_read_total") > 0, "expert bytes read > 0")
    check(metric(after, "shoal_expert_acquires_total") > metric(before,
                                                                "shoal_expert_acquires_total"),
          "expert acquires moved")
    # engine steps (one request at a time here): each prompt is one prefill
    # step, each later token one decode step of one row; the steps' acquires
    # and bytes read are the store's
    cached = delta("shoal_prompt_tokens_cached_total")
    check(delta("shoal_engine_steps_total", kind="prefill") == 3,
          "3 prefill steps (%g)" % delta("shoal_engine_steps_total", kind="prefill"))
    check(delta("shoal_engine_step_rows_total", kind="prefill") == want_prompt - cached,
          "prefill rows = prompt tokens not cached (%g vs %d)"
          % (delta("shoal_engine_step_rows_total", kind="prefill"), want_prompt - cached))
    dec = delta("shoal_engine_steps_total", kind="decode")
    check(dec == want_gen - 3 and delta("shoal_engine_step_rows_total", kind="decode") == dec,
          "decode steps = rows = tokens after the first of each (%g, %d)"
          % (dec, want_gen - 3))
    check(delta("shoal_engine_step_expert_acquires_total") ==
          delta("shoal_expert_acquires_total"),
          "the steps' acquires are the store's (%g vs %g)"
          % (delta("shoal_engine_step_expert_acquires_total"),
             delta("shoal_expert_acquires_total")))
    check(delta("shoal_engine_step_expert_bytes_read_total") <=
          delta("shoal_expert_bytes_read_total"), "the steps' bytes read are the store's")
    check(all(delta(n, kind=k) > 0 for n in ("shoal_engine_step_seconds_total",
                                             "shoal_engine_step_kv_bytes_total")
              for k in ("prefill", "decode")), "step seconds and KV bytes counted")
    stage = {k: metric(after, "shoal_engine_stage_seconds_total", stage=k)
             for k in ("attention", "routing", "experts", "expert_wait", "combine", "head")}
    check(all(delta("shoal_engine_stage_seconds_total", stage=k) > 0
              for k in ("attention", "experts", "head")),
          "stage seconds counted (attention, experts, head): %s" % stage)
    check(stage["expert_wait"] <= stage["experts"], "expert_wait is part of experts")
    if cluster:
        check(metric(after, "shoal_executor_up", address="local") == 1, "executor local up")
        check(metric(after, "shoal_executor_up", address=cluster) == 1,
              "executor %s up" % cluster)
        check(metric(after, "shoal_executor_requests_total", address=cluster) > 0,
              "the worker ran requests")
        check(metric(after, "shoal_executor_sent_bytes_total", address=cluster) > 0,
              "bytes sent to the worker")
    # the dashboard's snapshot agrees with /metrics (no request in between)
    snap = events(srv, 2)[-1]
    check(all(abs(snap["timings"][k] - stage[k]) < 1e-5 for k in stage),
          "snapshot timings = /metrics stage seconds (%s vs %s)" % (snap["timings"], stage))
    st = snap["store"]
    check(st["pinned"] == acq["pinned"] and st["cache"] == acq["cache"] and
          st["disk"] == acq["disk"], "snapshot store counts = /metrics (%s vs %s)" % (st, acq))
    h = snap["heat"]
    check(h["n_layer"] == N_LAYER and h["n_expert"] == N_EXPERT, "heat map shape")
    check(len(h["level"]) == N_LAYER and all(len(r) == N_EXPERT for r in h["level"]),
          "heat levels [n_layer][n_expert]")
    total = sum(sum(r) for r in h["total"])
    remote = metric(after, "shoal_expert_remote_runs_total")
    check(total == sum(acq.values()) + remote,
          "heat totals add up to acquires + worker runs (%d vs %d + %d)"
          % (total, sum(acq.values()), remote))
    check(max(max(r) for r in h["level"]) == 100, "the hottest cell is at 100")
    if cluster:
        check(remote > 0, "worker runs counted (shoal_expert_remote_runs_total)")
        check(any(t == 3 for r in h["tier"] for t in r) and "worker" in h,
              "some cells are the worker's")
        wi = [x["index"] for x in snap["executors"] if x["address"] == cluster]
        cells = [(h["tier"][il][ie], h["worker"][il][ie]) for il in range(N_LAYER)
                 for ie in range(N_EXPERT)]
        check(wi and all(w == wi[0] for t, w in cells if t == 3),
              "the worker's cells name it (executor %s): %s" % (wi, cells))
    check(snap["requests"]["completion_tokens"] == metric(after,
                                                          "shoal_completion_tokens_total"),
          "snapshot tokens = /metrics")
    return after


class Browser:
    """Headless chromium over the DevTools protocol."""

    def __init__(self, tmp, name):
        import websocket  # python3-websocket
        self.dir = os.path.join(tmp, name)
        os.makedirs(self.dir, exist_ok=True)
        self.p = subprocess.Popen(
            ["chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
             "--no-first-run", "--no-default-browser-check", "--disable-extensions",
             "--remote-debugging-port=0", "--remote-allow-origins=*",
             "--user-data-dir=" + self.dir, "--window-size=1280,860",
             "--hide-scrollbars", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=open(self.dir + ".log", "w"))
        port_file = os.path.join(self.dir, "DevToolsActivePort")
        if not wait_for(lambda: os.path.exists(port_file) and open(port_file).read().strip(),
                        60):
            raise RuntimeError("chromium did not start (no DevToolsActivePort)")
        port = int(open(port_file).read().split()[0])
        pages = json.load(urllib.request.urlopen("http://127.0.0.1:%d/json/list" % port))
        url = [p for p in pages if p.get("type") == "page"][0]["webSocketDebuggerUrl"]
        self.ws = websocket.create_connection(url, timeout=60, suppress_origin=True)
        self.id = 0

    def call(self, method, **params):
        self.id += 1
        self.ws.send(json.dumps({"id": self.id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.id:
                if "error" in msg:
                    raise RuntimeError("%s: %s" % (method, msg["error"]))
                return msg.get("result", {})

    def eval(self, expr):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True)
        return r.get("result", {}).get("value")

    def close(self):
        try:
            self.ws.close()
        finally:
            self.p.terminate()
            try:
                self.p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.p.kill()


DOM = """JSON.stringify({
  updates: Number(document.body.dataset.updates || 0),
  rows: [...document.querySelectorAll('#heat .row')].map(r => ({
    layer: r.dataset.layer,
    cells: [...r.querySelectorAll('.cell')].map(c => [Number(c.dataset.level || 0),
                                                     c.dataset.tier || '',
                                                     getComputedStyle(c).backgroundColor])})),
  requests: [...document.querySelectorAll('#requests tbody tr[data-id]')].map(
    r => [r.dataset.id, r.dataset.state]),
  executors: [...document.querySelectorAll('#executors tbody tr[data-address]')].map(
    r => [r.dataset.address, r.dataset.state]),
  timings: [...document.querySelectorAll('#timings > div')].map(
    p => [p.title, parseFloat(p.style.width) || 0]),
  timingsLegend: document.getElementById('timings-legend').textContent,
  store: document.getElementById('store').textContent,
  conn: document.getElementById('conn').textContent,
  running: document.getElementById('c-running').textContent,
  keyform: !document.getElementById('keyform').hidden,
})"""


def dom(b):
    """The page's state (updates 0 while it is still loading)."""
    v = b.eval("(() => { try { return %s; } catch (e) { return null; } })()" % DOM)
    return json.loads(v) if v else {"updates": 0, "rows": [], "requests": [],
                                    "executors": [], "timings": [], "timingsLegend": "",
                                    "store": "", "conn": "", "running": "",
                                    "keyform": False}


LEGEND_PART = re.compile(r"^(attention|routing|experts \(local\)|routed experts|network|"
                         r"combine \+ head) (\d+)%$")


def check_timings(d, where):
    """The 'Time per step' bar has parts and its legend names them with percentages."""
    parts = d["timings"]
    check(len(parts) >= 2 and all(w > 0 for _, w in parts) and
          abs(sum(w for _, w in parts) - 100) < 0.5,
          "%s: the time-per-step bar has parts adding up to 100%%: %s" % (where, parts))
    names = [p[0].split(":")[0] for p in parts]
    check("attention" in names, "%s: the bar has an attention part: %s" % (where, names))
    legend = d["timingsLegend"].split(", ") if d["timingsLegend"] else []
    m = [LEGEND_PART.match(x) for x in legend]
    check(legend and all(m) and "attention" in [x.group(1) for x in m] and
          abs(sum(int(x.group(2)) for x in m) - 100) <= len(m),
          "%s: the legend names the parts with percentages adding up to ~100: %r"
          % (where, d["timingsLegend"]))


def test_page(srv, tmp, cluster, screenshot):
    if not shutil.which("chromium"):
        print("SKIP: the browser checks: chromium is not installed "
              "(deploy/install-deps.sh installs Debian's chromium)")
        return
    try:
        import websocket  # noqa: F401
    except ImportError:
        print("SKIP: the browser checks: python3-websocket is not installed")
        return
    s, h, b = srv.request("GET", "/")
    check(s == 200 and h.get("content-type", "").startswith("text/html") and
          b"/dashboard.js" in b, "GET / is the dashboard page")
    for path, typ in (("/dashboard.js", "text/javascript"), ("/dashboard.css", "text/css")):
        s, h, _ = srv.request("GET", path)
        check(s == 200 and h.get("content-type", "").startswith(typ), "GET %s" % path)
    # a request that generates while the page is open (--test-token-delay)
    long_usage = {}

    def long_request():
        long_usage.update(complete(srv, "KING RICHARD III:", 200) or {})
    t = threading.Thread(target=long_request)
    br = Browser(tmp, "chromium")
    try:
        br.call("Page.enable")
        br.call("Page.navigate", url="http://127.0.0.1:%d/" % srv.port)
        wait_for(lambda: dom(br)["updates"] >= 1, 60, 0.2)
        t.start()
        d = wait_for(lambda: (lambda x: x if x["updates"] >= 2 and
                              any(st == "decode" for _, st in x["requests"]) else None)(dom(br)),
                     60, 0.2) or dom(br)
        check(d["updates"] >= 2, "the page got snapshots over the event stream (%d)"
              % d["updates"])
        check(d["conn"] == "live", "the page says live (%r)" % d["conn"])
        check(any(st == "decode" for _, st in d["requests"]),
              "the request table shows the running request in decode: %s" % d["requests"])
        check(d["running"].startswith("1"), "running: %r" % d["running"])
        check_timings(d, "with an expert store")
        if screenshot:   # while it generates
            height = br.eval("document.documentElement.scrollHeight") or 860
            shot = br.call("Page.captureScreenshot", format="png",
                           clip={"x": 0, "y": 0, "width": 1280, "height": min(height, 1600),
                                 "scale": 1})
            with open(screenshot, "wb") as f:
                f.write(base64.b64decode(shot["data"]))
            print("screenshot:", screenshot, os.path.getsize(screenshot), "bytes")
        rows = d["rows"]
        check(len(rows) == N_LAYER, "heat map: %d rows (layers), want %d" % (len(rows), N_LAYER))
        check(all(len(r["cells"]) == N_EXPERT for r in rows),
              "heat map: %d cells per row (experts)" % N_EXPERT)
        cells = [c for r in rows for c in r["cells"]]
        hot = [c for c in cells if c[0] > 0]
        check(len(hot) > 0, "heat map: some cells are non-zero")
        check(all(c[1] in ("pinned", "cache", "disk", "worker") for c in hot),
              "every non-zero cell has a tier: %s" % sorted(set(c[1] for c in hot)))
        check(all(c[2] not in ("", "rgba(0, 0, 0, 0)") for c in hot), "hot cells are coloured")
        tiers = set(c[1] for c in hot)
        check(tiers & {"pinned", "cache", "disk"}, "local tiers on the map: %s" % tiers)
        if cluster:
            check("worker" in tiers, "worker cells on the map: %s" % tiers)
        addrs = [a for a, _ in d["executors"]]
        check("local" in addrs, "the executors list shows the local store: %s" % addrs)
        if cluster:
            check(cluster in addrs, "the executors list shows the worker %s" % cluster)
        m = scrape(srv)
        check(metric(m, "shoal_dashboard_streams") >= 1, "/metrics counts the open dashboard")
        check(metric(m, "shoal_requests_running") == 1, "/metrics: one request running")
        t.join(120)
        check(long_usage.get("completion_tokens", 0) > 0, "the long request finished")
        # the finished request shows as such
        d = wait_for(lambda: (lambda x: x if x["requests"] and all(
            st in ("length", "stop") for _, st in x["requests"]) else None)(dom(br)), 20, 0.2) \
            or dom(br)
        check(len(d["requests"]) >= 4 and all(st in ("length", "stop") for _, st in
                                              d["requests"]),
              "the request table lists the finished requests: %s" % d["requests"])
    finally:
        if t.is_alive():
            t.join(120)
        br.close()


def test_key(shoal, tmp):
    kf = os.path.join(tmp, "api.key")
    with open(kf, "w") as f:
        f.write(KEY + "\n")
    os.chmod(kf, 0o600)
    srv = Server(shoal, "--api-key", kf)   # the checkpoint: no expert store
    try:
        auth = {"Authorization": "Bearer " + KEY}
        for path in ("/metrics", "/v1/dashboard/events"):
            s, _, b = srv.request("GET", path)
            check(s == 401 and b"invalid_api_key" in b, "%s without the key: 401" % path)
            s, _, _ = srv.request("GET", path, headers={"Authorization": "Bearer nope"})
            check(s == 401, "%s with a wrong key: 401" % path)
        for path in ("/", "/dashboard.js", "/health"):
            s, _, _ = srv.request("GET", path)
            check(s == 200, "%s needs no key" % path)
        s, _, _ = srv.post("/", {})
        check(s == 405, "POST / is 405")
        complete(srv, "ROMEO:", 4, headers=auth)
        m = scrape(srv, headers=auth)
        check(metric(m, "shoal_completion_tokens_total") > 0, "/metrics with the key")
        check(metric(m, "shoal_expert_acquires_total") == 0 and
              ("shoal_expert_acquires_total", '{tier="disk"}') not in m,
              "a checkpoint has no expert store families")
        snap = events(srv, 1, headers=auth)[0]
        check(snap["heat"] is None and snap["store"] is None and snap["executors"] == [],
              "a checkpoint's snapshot: no heat map, no store, no executors")
        if shutil.which("chromium"):
            try:
                br = Browser(tmp, "chromium-key")
            except ImportError:
                return
            try:
                br.call("Page.navigate", url="http://127.0.0.1:%d/" % srv.port)
                d = wait_for(lambda: (lambda x: x if x["keyform"] else None)(dom(br)), 30, 0.2)
                check(d is not None and d["conn"] == "API key needed",
                      "without the key the page asks for it")
                br.call("Page.navigate", url="http://127.0.0.1:%d/#key=%s" % (srv.port, KEY))
                d = wait_for(lambda: (lambda x: x if x["updates"] >= 1 else None)(dom(br)),
                             30, 0.2) or dom(br)
                check(d["updates"] >= 1 and d["conn"] == "live" and not d["keyform"],
                      "with /#key=KEY the page connects (%s)" % d["conn"])
                check(len(d["rows"]) == 0, "a checkpoint: no heat map rows")
                # no expert store, yet the step timings are drawn (they were
                # not: renderStore returned before them)
                check(d["store"] == "no expert store", "a checkpoint: %r" % d["store"])
                d = wait_for(lambda: (lambda x: x if x["timings"] else None)(dom(br)),
                             10, 0.2) or dom(br)
                check_timings(d, "a checkpoint (no expert store)")
                # SIGTERM with the dashboard connected
                t0 = time.time()
                rc = srv.stop()
                check(rc == 0, "SIGTERM with a dashboard connected: exit 0 (%d)" % rc)
                print("stopped in %.2f s with a dashboard connected" % (time.time() - t0))
            finally:
                br.close()
    finally:
        srv.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--worker")
    ap.add_argument("--screenshot", help="write the dashboard's screenshot here (PNG)")
    a = ap.parse_args()
    shoal = os.path.abspath(a.shoal)
    with tempfile.TemporaryDirectory(prefix="shoal_dashboard_") as tmp:
        ct = os.path.join(tmp, "shakespeare-moe")
        os.environ["OMP_WAIT_POLICY"] = "passive"   # every process below
        env = dict(os.environ)
        r = subprocess.run([shoal, "convert", MODEL, ct], capture_output=True, text=True,
                           timeout=300)
        check(r.returncode == 0, "convert the bundled model: " + r.stderr[-300:])
        # routing counts for the pinned hot-set
        r = subprocess.run([shoal, "run", "--model", ct, "--prompt", "ROMEO:", "--max-tokens",
                            "64", "--threads", "2"], capture_output=True, env=env, timeout=300)
        check(r.returncode == 0, "a run learns routing counts")
        cluster, flags, w, model = None, [], None, ct
        # one expert blob is 294,912 bytes: 4 pinned, 8 cached, the rest from disk
        store = ["--pin", "1200k", "--expert-cache", "2400k"]
        if a.worker:
            # two shards, each expert on one: the server's store holds one
            # (with the dense weights), the worker the other, so both run
            # experts whatever placement measures
            r = subprocess.run([shoal, "shard", ct, "--shards", "2", "--with-dense", "--out",
                                os.path.join(tmp, "shards")], capture_output=True, text=True,
                               timeout=300)
            check(r.returncode == 0, "shard the container: " + r.stderr[-300:])
            model = os.path.join(tmp, "shards", "shakespeare-moe")
            os.rename(os.path.join(tmp, "shards", "worker-0"), model)
            shutil.copy(os.path.join(ct, "routing_counts.json"), model)
            w = Worker(os.path.abspath(a.worker), tmp, "worker",
                       os.path.join(tmp, "shards", "worker-1"), "--threads", "1")
            cluster = w.wait_ready()
            check(cluster is not None, "the worker starts: " + w.text()[-300:])
            if cluster:
                flags = ["--workers", cluster, "--control", "off"]
                store = ["--pin", "600k", "--expert-cache", "1200k"]
        srv = Server(shoal, *store, "--test-token-delay", "25", *flags, model=model)
        try:
            test_metrics(srv, cluster)
            test_page(srv, tmp, cluster,
                      os.path.abspath(a.screenshot) if a.screenshot else
                      os.path.join(tmp, "dashboard.png"))
        finally:
            rc = srv.stop()
            check(rc == 0, "SIGTERM stops the server with status 0 (%d)" % rc)
            if w:
                w.stop()
        test_key(shoal, tmp)
    return result.summary("test_dashboard")


if __name__ == "__main__":
    sys.exit(main())
