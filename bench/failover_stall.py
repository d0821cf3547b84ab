#!/usr/bin/env python3
"""How long a run stalls when a worker dies (issue 33; results in
docs/BENCHMARKS.md "At DeepSeek-V3 widths").

N shoal-workers, each in its own network namespace behind a tbf link, hold
every expert R times (--shard I/N:R); the coordinator (root namespace,
--local-experts off) streams a greedy decode. Worker 0 is lost mid-decode
(after --kill-at tokens) or mid-prompt (--prompt-fraction of the baseline's
time to first token after the start), either as a process killed (SIGKILL:
its peer sees the connection close) or as a link cut (its veth down: nothing
tells the coordinator but the request timeout and the heartbeat). Every
case runs after a baseline without a loss and prints: the tokens identical
or not, the median gap between tokens, the longest gap after the loss (the
stall) and the time to first token against the baseline's.

Needs root. Usage:
  sudo /usr/bin/python3 bench/failover_stall.py --build build --model DIR \\
      [--workers 3] [--replicas 2] [--gen 40] [--kill-at 12] [--prompt-len 64] \\
      [--prompt-fraction 0.5] [--request-timeout 30] [--rate 1gbit] [--json OUT]
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "cluster"))
sys.path.insert(0, HERE)
import benchlib as bl  # noqa: E402
import netlab  # noqa: E402


def stream(cmd, on_token=None, on_start=None):
    """Run cmd; returns (stdout bytes, [arrival time of each token chunk
    since start], rc). on_token(i) runs after the i-th chunk, on_start()
    right after the process starts (in a thread of its own)."""
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if on_start:
        threading.Thread(target=on_start, daemon=True).start()
    err = []
    threading.Thread(target=lambda: err.append(p.stderr.read()), daemon=True).start()
    out, times = b"", []
    while True:
        b = p.stdout.read1(1 << 16)
        if not b:
            break
        out += b
        # one chunk per token: '[id]' for a model without a tokenizer
        for _ in range(max(1, b.count(b"["))):
            times.append(time.time() - t0)
            if on_token:
                on_token(len(times))
    rc = p.wait()
    time.sleep(0.05)
    return out, times, rc, (err[0] if err else b"").decode(errors="replace")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", required=True)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--gen", type=int, default=40)
    ap.add_argument("--kill-at", type=int, default=12)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--prompt-fraction", type=float, default=0.5)
    ap.add_argument("--request-timeout", type=float, default=30)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--workdir", default="/tmp/failover_stall")
    ap.add_argument("--json")
    a = ap.parse_args()
    ok, why = netlab.Lab.available()
    if not ok:
        print("failover_stall: skipped: %s" % why)
        return 0
    key = bl.write_cluster_key(a.workdir)
    shoal = os.path.join(a.build, "coordinator", "shoal")
    worker = os.path.join(a.build, "worker", "shoal-worker")
    ids = ",".join(str(1 + (i * 7919) % 1000) for i in range(a.prompt_len))
    results = []
    print("| lost | when | tokens identical | median gap ms | stall ms (longest gap after) | "
          "TTFT ms (baseline) |")
    print("|---|---|---|---|---|---|")
    for how in ("process", "link"):
        for when in ("decode", "prompt"):
            with netlab.Lab(prefix="shoalf%d" % os.getpid()) as lab:
                hosts = [lab.add_host("w%d" % i, rate=a.rate) for i in range(a.workers)]
                procs = []
                for i, h in enumerate(hosts):
                    lp = os.path.join(a.workdir, "w%d.log" % i)
                    cmd = [worker, "--model", a.model, "--listen", "%s:7070" % h.addr,
                           "--cluster-key", key, "--announce", "off",
                           "--shard", "%d/%d:%d" % (i, a.workers, a.replicas)]
                    with open(lp, "w") as lf:
                        procs.append(h.popen(cmd, stdout=lf, stderr=subprocess.STDOUT))
                for i, p in enumerate(procs):
                    bl._wait_ready(p, os.path.join(a.workdir, "w%d.log" % i), 600)
                run = [shoal, "run", "--model", a.model, "--workers",
                       ",".join("%s:7070" % h.addr for h in hosts), "--cluster-key", key,
                       "--local-experts", "off", "--tokens", ids, "--max-tokens", str(a.gen),
                       "--greedy", "--no-echo", "--ignore-eos", "--request-timeout",
                       str(a.request_timeout), "--connect-timeout", "60"]
                base_out, base_t, rc, err = stream(run)   # warms the workers' caches too
                base_out, base_t, rc, err = stream(run)
                if rc != 0:
                    raise RuntimeError("baseline run failed (%d): %s" % (rc, err[-2000:]))
                lost = {}

                def lose():
                    lost["t"] = time.time()
                    if how == "process":
                        os.killpg(procs[0].pid, signal.SIGKILL)
                    else:
                        subprocess.run(["ip", "link", "set", hosts[0].veth_root, "down"],
                                       check=True)

                if when == "decode":
                    t_run0 = time.time()
                    out, t, rc, err = stream(
                        run, on_token=lambda i: lose() if i == a.kill_at else None)
                    k = a.kill_at
                else:
                    t_run0 = time.time()
                    delay = base_t[0] * a.prompt_fraction
                    out, t, rc, err = stream(
                        run, on_start=lambda: (time.sleep(delay), lose()))
                    k = 0
                gaps_base = [y - x for x, y in zip(base_t, base_t[1:])]
                med = statistics.median(gaps_base)
                if when == "decode":
                    after = [y - x for x, y in zip(t[k - 1:], t[k:])]
                    stall = max(after) if after else None
                else:
                    stall = t[0] - base_t[0] if t else None
                r = {"lost": how, "when": when, "rc": rc, "identical": out == base_out,
                     "median_gap_ms": 1e3 * med,
                     "stall_ms": 1e3 * stall if stall is not None else None,
                     "ttft_ms": 1e3 * t[0] if t else None, "ttft_base_ms": 1e3 * base_t[0],
                     "lost_at_s": lost.get("t", 0) - t_run0}
                results.append(r)
                print("| %s | %s | %s | %.0f | %s | %s (%.0f) |" % (
                    "process killed" if how == "process" else "link cut",
                    "mid-decode (after %d tokens)" % a.kill_at if when == "decode" else
                    "mid-prompt (%.0f %% of its TTFT)" % (100 * a.prompt_fraction),
                    "yes" if r["identical"] and rc == 0 else "NO (rc %d)" % rc,
                    r["median_gap_ms"],
                    "%.0f" % r["stall_ms"] if r["stall_ms"] is not None else "-",
                    "%.0f" % r["ttft_ms"] if r["ttft_ms"] else "-", r["ttft_base_ms"]),
                    flush=True)
                if rc != 0:
                    print(err[-1500:], file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "args": vars(a), "cases": results},
                      f, indent=1)
    return 0 if all(r["identical"] and r["rc"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
