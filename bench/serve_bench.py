#!/usr/bin/env python3
"""shoal serve with 1, 2, 4 and 8 concurrent streams against the same
requests served one at a time (docs/BENCHMARKS.md, "Concurrent streams").

A synthetic container (shoal synth, real routing trace) is served with its
experts on disk: O_DIRECT reads (--direct on) and an expert cache smaller
than the experts (--cache-frac of the expert bytes). For each stream count
N, two fresh servers (--parallel N):

  serial     N x R requests one after another (one client): the baseline
  together   N clients at once, R requests each (the same requests)

and each of them twice: cold (the server just started: empty expert cache)
and warm (the same requests again on the same server). Every request
streams (SSE) a prompt of --prompt-len random token ids (its own seed) and
--max-tokens greedy tokens. Printed per configuration: aggregate tok/s
(generated tokens / wall time), per-stream tok/s (median over requests of
decode tokens / decode time), TTFT (median), expert bytes read and expert
acquires per generated token (the server's /metrics counters; an acquire is
one expert of one layer step for all the rows routed to it, so acquires per
token measure the batch-union's sharing); then the ratios of together to
serial: aggregate tok/s, bytes and acquires per token. The speedup is measured against the same engine in the same run:
the goal (issue 15) is >= 2.5x at 4 streams, with fewer bytes per token.

usage: bench/serve_bench.py --shoal build/coordinator/shoal [--model DIR | --gb 2]
       [--streams 1,2,4,8] [--requests 3] [--prompt-len 32] [--max-tokens 32]
       [--cache-frac 0.25] [--threads N] [--json out.json] [--workdir DIR]
"""
import argparse
import http.client
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import benchlib  # noqa: E402
from benchlib import log  # noqa: E402


class Server:
    """shoal serve on a free loopback port; log in a file."""

    def __init__(self, shoal, model, args, logpath):
        self.logpath = logpath
        self.lf = open(logpath, "w")
        env = dict(os.environ, OMP_WAIT_POLICY="passive")
        self.p = subprocess.Popen([shoal, "serve", "--model", model, "--port", "0"] + args,
                                  stdout=subprocess.DEVNULL, stderr=self.lf, env=env)
        self.port = None
        t0 = time.time()
        while time.time() - t0 < 300 and self.port is None:
            if self.p.poll() is not None:
                raise RuntimeError("shoal serve exited: " + self.log()[-1000:])
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", self.log())
            if m:
                self.port = int(m.group(1))
            else:
                time.sleep(0.05)
        if self.port is None:
            raise RuntimeError("shoal serve did not start: " + self.log()[-1000:])

    def log(self):
        with open(self.logpath, errors="replace") as f:
            return f.read()

    def counters(self):
        """(expert bytes read, expert acquires) so far from /metrics, or Nones."""
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            c.request("GET", "/metrics")
            r = c.getresponse()
            text = r.read().decode()
            c.close()
        except OSError:
            return None, None
        if r.status != 200:
            return None, None
        m = re.search(r"^shoal_expert_bytes_read_total(?:\{[^}]*\})? (\S+)$", text, re.M)
        acq = re.findall(r"^shoal_expert_acquires_total\{[^}]*\} (\S+)$", text, re.M)
        return (float(m.group(1)) if m else None,
                sum(float(x) for x in acq) if acq else None)

    def stop(self):
        """SIGTERM; returns the MB read its --stats line reports (or None)."""
        self.p.terminate()
        try:
            self.p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.lf.close()
        m = re.search(r"experts: io \S+, queue depth \d+: ([\d.]+) MB read", self.log())
        return float(m.group(1)) * 1e6 if m else None


def one_request(port, ids, max_tokens):
    """Stream one completion; returns (ttft s, decode tokens, decode s, tokens)."""
    body = json.dumps({"prompt": ids, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    t0 = time.time()
    c.request("POST", "/v1/completions", body=body,
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError("HTTP %d: %r" % (r.status, r.read()[:300]))
    t_first, t_last, n = None, None, 0
    usage = None
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            usage = ev["usage"]
        if ev.get("choices") and ev["choices"][0].get("text"):
            now = time.time()
            if t_first is None:
                t_first = now
            t_last = now
    c.close()
    n = usage["completion_tokens"] if usage else 0
    ttft = (t_first - t0) if t_first else float("nan")
    dec = (t_last - t_first) if t_first else 0.0
    return ttft, n, dec


def run_load(port, streams, max_tokens):
    """streams: a list of request lists (token id prompts), one per client,
    all started at once. Returns a summary dict."""
    results = []
    lock = threading.Lock()

    def client(reqs):
        for ids in reqs:
            r = one_request(port, ids, max_tokens)
            with lock:
                results.append(r)

    t0 = time.time()
    th = [threading.Thread(target=client, args=(s,)) for s in streams]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.time() - t0
    tokens = sum(r[1] for r in results)
    rates = [(r[1] - 1) / r[2] for r in results if r[1] > 1 and r[2] > 0]
    return {"requests": len(results), "tokens": tokens, "wall_s": wall,
            "agg_tok_s": tokens / wall if wall > 0 else 0.0,
            "stream_tok_s": statistics.median(rates) if rates else None,
            "ttft_ms": statistics.median(r[0] for r in results) * 1e3}


def measure(shoal, model, n_streams, reqs, mode, args, workdir, max_tokens):
    """One server: cold then warm. mode 'serial': all requests from one
    client; 'together': n_streams clients."""
    parallel = 1 if mode == "serial" else n_streams
    lp = os.path.join(workdir, "serve-%d-%s.log" % (n_streams, mode))
    srv = Server(shoal, model, args + ["--parallel", str(parallel), "--queue", "64"], lp)
    out = {}
    try:
        loads = [sum(reqs, [])] if mode == "serial" else reqs
        for phase in ("cold", "warm"):
            b0, a0 = srv.counters()
            res = run_load(srv.port, loads, max_tokens)
            b1, a1 = srv.counters()
            res["bytes_read"] = (b1 - b0) if b0 is not None and b1 is not None else None
            res["acquires"] = (a1 - a0) if a0 is not None and a1 is not None else None
            out[phase] = res
    finally:
        total = srv.stop()
    if out["cold"]["bytes_read"] is None and total is not None:
        out["cold"]["bytes_read_both_phases"] = total   # no /metrics: the --stats total
    for phase in out.values():
        b, a = phase.get("bytes_read"), phase.get("acquires")
        phase["mb_per_token"] = b / 1e6 / phase["tokens"] if b is not None and phase["tokens"] else None
        # routed experts acquired (each once per step and layer for all the
        # rows routed to it) per generated token: the batch-union's sharing
        phase["acquires_per_token"] = a / phase["tokens"] if a is not None and phase["tokens"] else None
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--model", help="a shoal container (default: shoal synth --gb GB)")
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--streams", default="1,2,4,8")
    ap.add_argument("--requests", type=int, default=3, help="requests per stream")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--cache-frac", type=float, default=0.25,
                    help="expert cache as a fraction of the expert bytes")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--serve-args", default="",
                    help="more shoal serve flags, e.g. '--pin 200M' (space-separated)")
    ap.add_argument("--json")
    ap.add_argument("--workdir")
    a = ap.parse_args()
    workdir = a.workdir or tempfile.mkdtemp(prefix="serve-bench-")
    os.makedirs(workdir, exist_ok=True)
    shoal = os.path.abspath(a.shoal)
    model = a.model
    if not model:
        model = os.path.join(workdir, "synth")
        if not os.path.exists(os.path.join(model, "shoal.json")):
            benchlib.sh([shoal, "synth", "--out", model, "--gb", str(a.gb), "--experts",
                         "int4a8", "--dense", "int4a8"], check=True)
    ci = benchlib.container_info(model)
    expert_bytes = ci.get("expert_bytes") or 0
    cache = int(expert_bytes * a.cache_frac)
    args = ["--expert-cache", str(cache), "--direct", "on", "--stats"]
    if a.threads:
        args += ["--threads", str(a.threads)]
    args += a.serve_args.split()
    with open(os.path.join(model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    streams = [int(x) for x in a.streams.split(",")]
    machine = benchlib.machine_info(model)
    log("serve_bench: %s, experts %.2f GB, cache %.2f GB (%.0f%%), O_DIRECT; %s" %
        (model, expert_bytes / 1e9, cache / 1e9, a.cache_frac * 100, machine.get("cpu")))
    rng = random.Random(1)
    results = {"machine": machine, "model": model, "expert_bytes": expert_bytes,
               "cache_bytes": cache, "prompt_len": a.prompt_len, "max_tokens": a.max_tokens,
               "requests_per_stream": a.requests, "runs": []}
    hdr = ("%-8s %-9s %-5s %9s %9s %9s %9s %9s %8s" %
           ("streams", "mode", "phase", "agg tok/s", "strm tok/s", "TTFT ms", "MB/token",
            "acq/token", "requests"))
    print(hdr)
    for n in streams:
        reqs = [[[rng.randrange(vocab) for _ in range(a.prompt_len)]
                 for _ in range(a.requests)] for _ in range(n)]
        row = {"streams": n}
        for mode in ("serial", "together"):
            if mode == "together" and n == 1:
                row[mode] = row["serial"]
                continue
            row[mode] = measure(shoal, model, n, reqs, mode, args, workdir, a.max_tokens)
            for phase in ("cold", "warm"):
                r = row[mode][phase]
                print("%-8d %-9s %-5s %9.2f %9s %9.0f %9s %9s %8d" %
                      (n, mode, phase, r["agg_tok_s"],
                       "%.2f" % r["stream_tok_s"] if r["stream_tok_s"] else "n/a",
                       r["ttft_ms"],
                       "%.2f" % r["mb_per_token"] if r["mb_per_token"] is not None else "n/a",
                       "%.1f" % r["acquires_per_token"]
                       if r["acquires_per_token"] is not None else "n/a",
                       r["requests"]), flush=True)
        for phase in ("cold", "warm"):
            s, t = row["serial"][phase], row["together"][phase]
            sp = benchlib.ratio(t["agg_tok_s"], s["agg_tok_s"])
            br = (benchlib.ratio(t["mb_per_token"], s["mb_per_token"])
                  if t["mb_per_token"] and s["mb_per_token"] else None)
            ar = (benchlib.ratio(t["acquires_per_token"], s["acquires_per_token"])
                  if t["acquires_per_token"] and s["acquires_per_token"] else None)
            row["speedup_" + phase] = sp
            row["bytes_ratio_" + phase] = br
            row["acquires_ratio_" + phase] = ar
            print("  %d streams %s: %.2fx the aggregate tok/s of one at a time%s%s" %
                  (n, phase, sp or 0, ", %.2fx the bytes per token" % br if br else "",
                   ", %.2fx the expert acquires per token" % ar if ar else ""))
        results["runs"].append(row)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    log("serve_bench: logs in %s" % workdir)


if __name__ == "__main__":
    main()
