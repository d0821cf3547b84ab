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

Beside each figure, the bound of that configuration (issue 34) and the
ratio measured / bound. A step (one forward pass over the batch's rows,
/metrics shoal_engine_step_*) reads at least the dense weights once
(attention, router, shared expert, head: shared by its rows), each expert
of its rows' union once (the acquires) and the KV rows its rows attend
over; in RAM it cannot take less than those bytes over the RAM read probe
(bench/ram_probe.c, at the server's threads). The expert bytes the store
read from disk during the steps add their time at fio's random O_DIRECT
read rate of one expert blob at the store's queue depth (reads and compute
taken as not overlapping). The dense bytes per step and the bytes of one
expert are `shoal bench --json`'s (token_dense_read_mb, expert_compute_mb).
Bound tok/s = generated tokens / the steps' bound seconds, prefill steps
included; "steps" compares the steps' own wall time with their bound (the
rest of the wall time is HTTP, sampling and idle slots). The RAM probe and
fio run before and after each server (these machines' RAM and disk rates
swing from minute to minute); its bound takes the means of the two.

The server runs at shoal's own OpenMP wait policy, as users run it (the
caller's OMP_WAIT_POLICY, if set, passes through); until 2026-12-06 it ran
with OMP_WAIT_POLICY=passive, which cost a decode step about a fifth
(issue 31's finding for shoal run).

usage: bench/serve_bench.py --shoal build/coordinator/shoal [--model DIR | --gb 2]
       [--streams 1,2,4,8] [--requests 3] [--prompt-len 32] [--max-tokens 32]
       [--cache-frac 0.25] [--threads N] [--json out.json] [--workdir DIR]
       [--cache-policy lru,freq] [--fio-runtime 10] [--no-fio] [--serve-args ARGS]

--cache-policy lru,freq runs every configuration under each policy, the
order swapped at each stream count, and ends with their ratios (tok/s and
MB read per token).
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
        env = dict(os.environ)   # shoal's own wait policy unless the caller sets one
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
        """The /metrics counters so far: expert bytes read and acquires,
        seconds with reads in flight and the forward pass stalled on them,
        and the step counters by kind ({} when /metrics does not answer;
        None for what it lacks)."""
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            c.request("GET", "/metrics")
            r = c.getresponse()
            text = r.read().decode()
            c.close()
        except OSError:
            return {}
        if r.status != 200:
            return {}

        def one(name):
            m = re.search(r"^%s(?:\{[^}]*\})? (\S+)$" % name, text, re.M)
            return float(m.group(1)) if m else None
        acq = re.findall(r"^shoal_expert_acquires_total\{[^}]*\} (\S+)$", text, re.M)
        steps = {}
        for name, kind, v in re.findall(
                r'^shoal_engine_(steps|step_\w+?)_total\{kind="(\w+)"\} (\S+)$', text, re.M):
            steps.setdefault(kind, {})[name] = float(v)
        return {"bytes_read": one("shoal_expert_bytes_read_total"),
                "acquires": sum(float(x) for x in acq) if acq else None,
                "read_s": one("shoal_expert_read_seconds_total"),
                "stall_s": one("shoal_expert_stall_seconds_total"),
                "steps": steps or None}

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


def measure(shoal, model, n_streams, reqs, mode, args, workdir, max_tokens, limits):
    """One server: cold then warm, between limits(False) and limits(True)
    (their means in out["limits"]). mode 'serial': all requests from one client;
    'together': n_streams clients."""
    parallel = 1 if mode == "serial" else n_streams
    before = limits(False)
    pol = args[args.index("--cache-policy") + 1] if "--cache-policy" in args else "default"
    lp = os.path.join(workdir, "serve-%d-%s-%s.log" % (n_streams, mode, pol))
    srv = Server(shoal, model, args + ["--parallel", str(parallel), "--queue", "64"], lp)
    out = {}
    try:
        loads = [sum(reqs, [])] if mode == "serial" else reqs
        for phase in ("cold", "warm"):
            c0 = srv.counters()
            res = run_load(srv.port, loads, max_tokens)
            c1 = srv.counters()
            res["loadavg"] = benchlib.loadavg()   # other processes on these shared cores
            for k in ("bytes_read", "acquires", "read_s", "stall_s"):
                res[k] = (c1[k] - c0[k]) if c0.get(k) is not None and c1.get(k) is not None \
                    else None
            s0, s1 = c0.get("steps"), c1.get("steps")
            if s0 and s1:
                res["steps"] = {k: {n: s1[k][n] - s0.get(k, {}).get(n, 0.0) for n in s1[k]}
                                for k in s1}
            out[phase] = res
    finally:
        total = srv.stop()
    after = limits(True)
    out["limits"] = {"ram_read_gbs": statistics.mean([before["ram_read_gbs"],
                                                      after["ram_read_gbs"]]),
                     "fio_mb_s": (statistics.mean([before["fio_mb_s"], after["fio_mb_s"]])
                                  if before["fio_mb_s"] and after["fio_mb_s"] else None),
                     "passes": [before, after]}
    if out["cold"]["bytes_read"] is None and total is not None:
        out["cold"]["bytes_read_both_phases"] = total   # no /metrics: the --stats total
    for phase in (out["cold"], out["warm"]):
        b, a = phase.get("bytes_read"), phase.get("acquires")
        phase["mb_per_token"] = b / 1e6 / phase["tokens"] if b is not None and phase["tokens"] else None
        # routed experts acquired (each once per step and layer for all the
        # rows routed to it) per generated token: the batch-union's sharing
        phase["acquires_per_token"] = a / phase["tokens"] if a is not None and phase["tokens"] else None
    return out


def measure_limits(ci, threads, qd, fio_runtime, workdir, skip_fio):
    """One pass of the limits: the RAM read probe at the server's threads
    (GB/s) and fio random O_DIRECT reads of one blob at queue depth qd
    (MB/s; None when skipped or failed)."""
    exe = build_ram_probe_once(workdir)
    ram = max((benchlib.ram_probe(exe, threads) for _ in range(2)), key=lambda p: p["read_gbs"])
    fio = None
    if not skip_fio:
        f = benchlib.fio_randread(ci["experts_file"], ci["blob_bytes"], ci["experts_file_bytes"],
                                  qd, fio_runtime, "io_uring")
        fio = f.get("mb_per_s")
        if fio is None:
            log("serve_bench: fio failed: %s" % f.get("error"))
    return {"ram_read_gbs": ram["read_gbs"], "fio_mb_s": fio}


_RAM_PROBE = {}


def build_ram_probe_once(workdir):
    if "exe" not in _RAM_PROBE:
        _RAM_PROBE["exe"] = benchlib.build_ram_probe(workdir)
    return _RAM_PROBE["exe"]


def token_parts(shoal, model, threads, workdir):
    """shoal bench's bytes of a warm decode token: (dense MB a step reads
    once, MB of one routed expert)."""
    out = os.path.join(workdir, "token-bytes.json")
    cmd = [shoal, "bench", "--model", model, "--state", "warm", "--gen", "4", "--reps", "1",
           "--limits", "off", "--json", out]
    if threads:
        cmd += ["--threads", str(threads)]
    benchlib.sh(cmd, check=True, env={"OMP_WAIT_POLICY": "passive"})
    with open(out) as f:
        fig = json.load(f)["runs"][0]["figures"]
    return fig["token_dense_read_mb"], fig["expert_compute_mb"]


def bound(res, lim, dense_mb, expert_mb):
    """The bound of one phase (module doc): seconds its steps take at least,
    by kind and in all, and the tok/s it allows. None without step
    counters."""
    st = res.get("steps")
    if not st or not lim.get("ram_read_gbs"):
        return None
    ram = lim["ram_read_gbs"] * 1e9
    fio = (lim.get("fio_mb_s") or 0) * 1e6
    out = {"kinds": {}}
    total = measured = 0.0
    for kind, c in sorted(st.items()):
        ram_b = (c.get("steps", 0) * dense_mb * 1e6 + c.get("step_expert_acquires", 0) *
                 expert_mb * 1e6 + c.get("step_kv_bytes", 0))
        disk_b = c.get("step_expert_bytes_read", 0)
        if disk_b and not fio:
            return None
        sec = ram_b / ram + (disk_b / fio if disk_b else 0.0)
        out["kinds"][kind] = {"steps": c.get("steps"), "rows": c.get("step_rows"),
                              "ram_bytes": ram_b, "disk_bytes": disk_b, "bound_s": sec,
                              "step_s": c.get("step_seconds")}
        total += sec
        measured += c.get("step_seconds", 0.0)
    out["bound_s"] = total
    out["step_s"] = measured
    # where the steps' time went: waiting for expert reads, and the share
    # of it with a read in flight (the disk busy)
    if res.get("stall_s") is not None and measured > 0:
        out["stall_frac"] = res["stall_s"] / measured
    if res.get("read_s") is not None and measured > 0:
        out["disk_busy_frac"] = res["read_s"] / measured
    out["tok_s"] = res["tokens"] / total if total > 0 else None
    out["ratio"] = benchlib.ratio(res["agg_tok_s"], out["tok_s"])
    out["steps_ratio"] = benchlib.ratio(total, measured)   # step wall time vs its bound
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
    ap.add_argument("--fio-runtime", type=int, default=10,
                    help="seconds of each fio pass (the disk's limit)")
    ap.add_argument("--no-fio", action="store_true",
                    help="skip fio (the bound then needs every expert in RAM)")
    ap.add_argument("--cache-policy", default="",
                    help="lru, freq, or both (lru,freq): each configuration is run with "
                    "each, alternating (default: the server's)")
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
    threads = a.threads or os.cpu_count()
    qd = 8
    for i, x in enumerate(args):
        if x == "--queue-depth" and i + 1 < len(args):
            qd = int(args[i + 1])
    dense_mb, expert_mb = token_parts(shoal, model, a.threads, workdir)
    log("serve_bench: a step reads %.1f MB of dense weights once and %.2f MB per expert "
        "acquired; limits: the RAM read probe at %d threads, fio QD%d bs=%d" %
        (dense_mb, expert_mb, threads, qd, ci["blob_bytes"]))

    passes = []   # (pass, servers run before it)
    served = [0]

    def limits(after):
        """A pass of the limits; before a server the last one is reused
        when no server ran since (the one after the previous server)."""
        if not after and passes and passes[-1][1] == served[0]:
            return passes[-1][0]
        if after:
            served[0] += 1
        p = measure_limits(ci, threads, qd, a.fio_runtime, workdir, a.no_fio)
        passes.append((p, served[0]))
        log("  limits: RAM read %.1f GB/s, fio %s MB/s" % (p["ram_read_gbs"],
                                                          benchlib.fmt(p["fio_mb_s"])))
        return p

    policies = [x for x in a.cache_policy.split(",") if x] or [None]
    rng = random.Random(1)
    results = {"machine": machine, "model": model, "expert_bytes": expert_bytes,
               "cache_bytes": cache, "prompt_len": a.prompt_len, "max_tokens": a.max_tokens,
               "requests_per_stream": a.requests, "serve_args": args,
               "token_dense_read_mb": dense_mb, "expert_compute_mb": expert_mb,
               "threads": threads, "queue_depth": qd, "policies": policies, "runs": []}
    hdr = ("%-7s %-6s %-8s %-5s %9s %9s %6s %6s %9s %8s %9s %9s %5s %6s %7s %5s" %
           ("streams", "policy", "mode", "phase", "agg tok/s", "bound", "ratio", "steps",
            "strm tok/s", "TTFT ms", "MB/token", "acq/token", "reqs", "RAM", "fio", "load"))
    print(hdr)
    rows = []
    for ni, n in enumerate(streams):
        reqs = [[[rng.randrange(vocab) for _ in range(a.prompt_len)]
                 for _ in range(a.requests)] for _ in range(n)]
        by_pol = {pol: {"streams": n, "policy": pol or "default"} for pol in policies}
        # the policies alternate, the order swapped at each stream count
        order = policies if ni % 2 == 0 else policies[::-1]
        for mode in ("serial", "together"):
            for pol in order:
                row = by_pol[pol]
                if mode == "together" and n == 1:
                    row[mode] = row["serial"]
                    continue
                pargs = args + (["--cache-policy", pol] if pol else [])
                row[mode] = measure(shoal, model, n, reqs, mode, pargs, workdir, a.max_tokens,
                                    limits)
                lim = row[mode]["limits"]
                for phase in ("cold", "warm"):
                    r = row[mode][phase]
                    b = r["bound"] = bound(r, lim, dense_mb, expert_mb)
                    print("%-7d %-6s %-8s %-5s %9.2f %9s %6s %6s %9s %8.0f %9s %9s %5d %6.1f %7s %5s"
                          % (n, row["policy"], mode, phase, r["agg_tok_s"],
                             benchlib.fmt(b and b["tok_s"], nd=2),
                             benchlib.fmt(b and b["ratio"], nd=2),
                             benchlib.fmt(b and b["steps_ratio"], nd=2),
                             "%.2f" % r["stream_tok_s"] if r["stream_tok_s"] else "n/a",
                             r["ttft_ms"],
                             "%.2f" % r["mb_per_token"] if r["mb_per_token"] is not None
                             else "n/a",
                             "%.1f" % r["acquires_per_token"]
                             if r["acquires_per_token"] is not None else "n/a",
                             r["requests"], lim["ram_read_gbs"], benchlib.fmt(lim["fio_mb_s"]),
                             benchlib.fmt(r["loadavg"] and r["loadavg"][0], nd=1)),
                          flush=True)
        for pol in policies:
            row = by_pol[pol]
            for phase in ("cold", "warm"):
                s_, t = row["serial"][phase], row["together"][phase]
                sp = benchlib.ratio(t["agg_tok_s"], s_["agg_tok_s"])
                br = (benchlib.ratio(t["mb_per_token"], s_["mb_per_token"])
                      if t["mb_per_token"] and s_["mb_per_token"] else None)
                ar = (benchlib.ratio(t["acquires_per_token"], s_["acquires_per_token"])
                      if t["acquires_per_token"] and s_["acquires_per_token"] else None)
                row["speedup_" + phase] = sp
                row["bytes_ratio_" + phase] = br
                row["acquires_ratio_" + phase] = ar
                print("  %d streams %s %s: %.2fx the aggregate tok/s of one at a time%s%s" %
                      (n, row["policy"], phase, sp or 0,
                       ", %.2fx the bytes per token" % br if br else "",
                       ", %.2fx the expert acquires per token" % ar if ar else ""))
            results["runs"].append(row)
            rows.append(row)
    print("ratio = measured / bound; steps = the steps' bound / their wall time; RAM "
          "(GB/s) and fio (MB/s): the limits' means around that server; load: the 1-minute "
          "load average at the phase's end (2 cores: above ~2, other processes competed)")
    for row in rows:
        for mode in ("serial", "together"):
            if mode == "together" and row["streams"] == 1:
                continue
            for phase in ("cold", "warm"):
                b = row[mode][phase]["bound"]
                if b:
                    print("  %d streams %s %-8s %s: %s; stalled on reads %s, disk busy %s "
                          "of the steps' time" % (
                              row["streams"], row["policy"], mode, phase, ", ".join(
                                  "%s %d steps %.2f s, bound %.2f s" %
                                  (k, v["steps"] or 0, v["step_s"] or 0, v["bound_s"])
                                  for k, v in sorted(b["kinds"].items())),
                              benchlib.fmt(100 * b["stall_frac"], "%") if "stall_frac" in b
                              else "n/a",
                              benchlib.fmt(100 * b["disk_busy_frac"], "%")
                              if "disk_busy_frac" in b else "n/a"))
    if len(policies) > 1:
        base = policies[0]
        print("cache policies against %s (same streams, mode and phase): aggregate tok/s, "
              "MB read per token" % base)
        for n in streams:
            rs = {r["policy"]: r for r in rows if r["streams"] == n}
            for pol in policies[1:]:
                for mode in ("serial", "together"):
                    if mode == "together" and n == 1:
                        continue
                    for phase in ("cold", "warm"):
                        x, y = rs[pol][mode][phase], rs[base][mode][phase]
                        print("  %d streams %-8s %s: %s %.2fx tok/s, %sx MB/token" % (
                            n, mode, phase, pol, benchlib.ratio(x["agg_tok_s"],
                                                                y["agg_tok_s"]) or 0,
                            benchlib.fmt(benchlib.ratio(x["mb_per_token"], y["mb_per_token"]),
                                         nd=2)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    log("serve_bench: logs in %s" % workdir)


if __name__ == "__main__":
    main()
