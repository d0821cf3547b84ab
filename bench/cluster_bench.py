#!/usr/bin/env python3
"""The cluster benchmark (issue 5; protocol in docs/BENCHMARKS.md).

Each figure is a ratio between two configurations measured in the same
run, alternating their order between repetitions (these machines are
shared and noisy):

  (a) warm, loopback: coordinator + 1 shoal-worker (--local-experts off)
      against the same decode in one process, every expert pinned in RAM
      on both sides. Target: >= 0.9x the in-process tok/s.
  (b) cold, 2 workers in separate network namespaces, each one's disk
      throttled (cgroup v1 blkio) to the same bandwidth, page cache dropped,
      O_DIRECT reads, a small expert cache: 2 workers against 1.
      Target: >= 1.8x.
  (c) cold, asymmetric: one worker throttled to a third of the other's
      bandwidth. Both against the fast worker alone. Target: >= 1.25x and
      never below 1.
Also reported: bytes on the wire per token and heartbeat RTT per executor.

Needs root (namespaces, blkio, drop_caches) for (b) and (c); (a) runs
anywhere. Usage:
  /usr/bin/python3 bench/cluster_bench.py --build build --model DIR \\
      [--gen 16] [--repeat 3] [--mbps 100] [--json OUT.json] [--only a,b,c]
"""
import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "cluster"))
sys.path.insert(0, HERE)
import benchlib as bl  # noqa: E402
import netlab  # noqa: E402


log, free_port, drop_caches = bl.log, bl.free_port, bl.drop_caches


DECODE = re.compile(r"decode (\d+) tokens, ([0-9.]+) tok/s")
EXEC = re.compile(r"executor (\d+) (\S+): (\S+), (\d+) experts, (\d+) requests, (\d+) errors, "
                  r"(\d+) reconnects, ([0-9.]+) MB sent, ([0-9.]+) MB received, rtt ([0-9.]+) ms")


def parse_run(stderr):
    m = DECODE.search(stderr)
    if not m:
        raise RuntimeError("no decode line in shoal's output:\n" + stderr[-3000:])
    out = {"decode_tokens": int(m.group(1)), "decode_tok_s": float(m.group(2)), "executors": []}
    for e in EXEC.finditer(stderr):
        out["executors"].append({"address": e.group(2), "state": e.group(3),
                                 "requests": int(e.group(5)), "errors": int(e.group(6)),
                                 "mb_sent": float(e.group(8)), "mb_received": float(e.group(9)),
                                 "rtt_ms": float(e.group(10))})
    return out


class Bench:
    def __init__(self, args):
        self.a = args
        self.shoal = os.path.join(args.build, "coordinator", "shoal")
        self.worker = os.path.join(args.build, "worker", "shoal-worker")
        self.env = dict(os.environ, OMP_WAIT_POLICY="passive")
        self.tokens = ",".join(str(t) for t in (11, 22, 33, 44))
        self.procs = []

    def run_shoal(self, extra, timeout=900):
        cmd = [self.shoal, "run", "--model", self.a.model, "--tokens", self.tokens,
               "--max-tokens", str(self.a.gen), "--greedy", "--no-echo", "--ignore-eos",
               "--stats"] + extra
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=self.env)
        if r.returncode != 0:
            raise RuntimeError("%s failed (%d):\n%s" % (" ".join(cmd), r.returncode,
                                                        r.stderr[-3000:]))
        res = parse_run(r.stderr)
        res["command"] = cmd
        res["ids"] = r.stdout.strip()
        return res

    def start_worker(self, argv, host=None, blkio=None, log_path=None):
        out = open(log_path or os.devnull, "w")
        if host:
            p = host.popen(argv, blkio_bps=blkio, stdout=out, stderr=subprocess.STDOUT,
                           env=self.env)
        else:
            p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                 start_new_session=True)
            self.procs.append(p)
        return p

    def wait_port(self, addr, port, p, timeout=120):
        t0 = time.time()
        while time.time() - t0 < timeout:
            if p.poll() is not None:
                raise RuntimeError("worker exited with %d" % p.returncode)
            try:
                socket.create_connection((addr, port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("worker on %s:%d did not listen within %d s" % (addr, port, timeout))

    def stop(self, p):
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except OSError:
                pass
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    # (a) ---------------------------------------------------------------
    def warm_loopback(self):
        pin = "unlimited"
        port = free_port()
        w = self.start_worker([self.worker, "--model", self.a.model, "--listen",
                               "127.0.0.1:%d" % port, "--pin", pin],
                              log_path=os.path.join(self.a.workdir, "warm-worker.log"))
        try:
            self.wait_port("127.0.0.1", port, w, timeout=600)
            runs = {"in-process": [], "1 worker (loopback)": []}
            for rep in range(self.a.repeat):
                order = list(runs) if rep % 2 == 0 else list(reversed(list(runs)))
                for name in order:
                    extra = ["--pin", pin]
                    if name != "in-process":
                        extra = ["--workers", "127.0.0.1:%d" % port, "--local-experts", "off"]
                    r = self.run_shoal(extra)
                    runs[name].append(r)
                    log("  (a) %-22s %.2f tok/s" % (name, r["decode_tok_s"]))
        finally:
            self.stop(w)
        ids = {r["ids"] for rs in runs.values() for r in rs}
        med = {k: statistics.median(r["decode_tok_s"] for r in v) for k, v in runs.items()}
        ratio = med["1 worker (loopback)"] / med["in-process"]
        return {"runs": runs, "median_tok_s": med, "ratio": ratio, "target": 0.9,
                "same_tokens": len(ids) == 1,
                "wire_per_token": self.wire_per_token(runs["1 worker (loopback)"][-1])}

    def wire_per_token(self, r):
        toks = max(1, r["decode_tokens"] + 4)
        return [{"address": e["address"], "kb_sent_per_token": e["mb_sent"] * 1e3 / toks,
                 "kb_received_per_token": e["mb_received"] * 1e3 / toks,
                 "requests_per_token": e["requests"] / toks, "rtt_ms": e["rtt_ms"]}
                for e in r["executors"] if e["address"] != "local"]

    # (b), (c) -----------------------------------------------------------
    def cold(self, lab, key, bandwidths, name):
        """One cold decode with len(bandwidths) workers in namespaces."""
        drop_caches()
        hosts = self.hosts[:len(bandwidths)]
        ws = []
        try:
            for h, bw in zip(hosts, bandwidths):
                argv = [self.worker, "--model", self.a.model, "--listen", "%s:7070" % h.addr,
                        "--cluster-key", key, "--direct", "on", "--expert-cache",
                        self.a.worker_cache]
                ws.append((h, self.start_worker(
                    argv, host=h, blkio=int(bw * 1e6),
                    log_path=os.path.join(self.a.workdir, "%s-%s.log" % (name, h.name)))))
            for h, p in ws:
                self.wait_port(h.addr, 7070, p)
            addrs = ",".join("%s:7070" % h.addr for h in hosts)
            return self.run_shoal(["--workers", addrs, "--cluster-key", key,
                                   "--local-experts", "off", "--connect-timeout", "60"])
        finally:
            for _, p in ws:
                self.stop(p)

    def cold_cluster(self):
        ok, why = netlab.Lab.available()
        if not ok:
            return {"skipped": why}
        key = os.path.join(self.a.workdir, "cluster.key")
        with open(key, "w") as f:
            f.write("bench key " + os.urandom(16).hex() + "\n")
        os.chmod(key, 0o600)
        bw = self.a.mbps
        configs = {
            "b: 1 worker": [bw],
            "b: 2 workers, equal disks": [bw, bw],
            "c: 2 workers, second at 1/3": [bw, bw / 3],
        }
        runs = {k: [] for k in configs}
        with netlab.Lab() as lab:
            self.hosts = [lab.add_host("w0"), lab.add_host("w1")]
            for rep in range(self.a.repeat):
                order = list(configs) if rep % 2 == 0 else list(reversed(list(configs)))
                for name in order:
                    r = self.cold(lab, key, configs[name], "rep%d-%s" % (rep, name[:1]))
                    runs[name].append(r)
                    log("  (%s) %-28s %.3f tok/s" % (name[0], name[3:], r["decode_tok_s"]))
        med = {k: statistics.median(r["decode_tok_s"] for r in v) for k, v in runs.items()}
        one = med["b: 1 worker"]
        ids = {r["ids"] for rs in runs.values() for r in rs}
        return {"runs": runs, "median_tok_s": med, "mbps_per_worker": bw,
                "same_tokens": len(ids) == 1,
                "ratio_2_equal": med["b: 2 workers, equal disks"] / one, "target_2_equal": 1.8,
                "ratio_asym": med["c: 2 workers, second at 1/3"] / one, "target_asym": 1.25,
                "min_ratio_asym": min(r["decode_tok_s"] for r in runs["c: 2 workers, second at 1/3"]) / one,
                "wire_per_token": self.wire_per_token(runs["b: 2 workers, equal disks"][-1])}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--model", required=True, help="a shoal container (e.g. from shoal synth)")
    ap.add_argument("--gen", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--mbps", type=float, default=100.0, help="throttled disk MB/s per worker")
    ap.add_argument("--worker-cache", default="64M")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--only", default="a,b")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    a.workdir = a.workdir or tempfile.mkdtemp(prefix="shoal-cluster-bench-")
    os.makedirs(a.workdir, exist_ok=True)
    b = Bench(a)
    out = {"model": a.model, "gen": a.gen, "repeat": a.repeat,
           "commit": subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"],
                                    capture_output=True, text=True).stdout.strip(),
           "loadavg_before": open("/proc/loadavg").read().split()[:3]}
    try:
        if "a" in a.only:
            log("(a) warm decode over loopback, %d repetitions" % a.repeat)
            out["warm_loopback"] = b.warm_loopback()
        if "b" in a.only:
            log("(b, c) cold decode, workers in network namespaces at %.0f MB/s" % a.mbps)
            out["cold_cluster"] = b.cold_cluster()
    finally:
        for p in b.procs:
            b.stop(p)
    out["loadavg_after"] = open("/proc/loadavg").read().split()[:3]
    print()
    if "warm_loopback" in out:
        w = out["warm_loopback"]
        print("(a) warm, loopback: 1 worker %.2f tok/s vs in-process %.2f tok/s = %.2fx "
              "(target >= 0.9); same tokens: %s" % (w["median_tok_s"]["1 worker (loopback)"],
                                                   w["median_tok_s"]["in-process"], w["ratio"],
                                                   w["same_tokens"]))
        for e in w["wire_per_token"]:
            print("    wire per token: %.1f KB sent, %.1f KB received, %.1f requests, rtt %.2f ms"
                  % (e["kb_sent_per_token"], e["kb_received_per_token"],
                     e["requests_per_token"], e["rtt_ms"]))
    if "cold_cluster" in out:
        c = out["cold_cluster"]
        if "skipped" in c:
            print("(b, c) skipped: %s" % c["skipped"])
        else:
            m = c["median_tok_s"]
            print("(b) cold, %.0f MB/s disks: 2 workers %.3f tok/s vs 1 worker %.3f tok/s = "
                  "%.2fx (target >= 1.8)" % (c["mbps_per_worker"], m["b: 2 workers, equal disks"],
                                             m["b: 1 worker"], c["ratio_2_equal"]))
            print("(c) cold, second disk at 1/3: %.3f tok/s = %.2fx the fast worker alone "
                  "(target >= 1.25; lowest run %.2fx); same tokens: %s"
                  % (m["c: 2 workers, second at 1/3"], c["ratio_asym"], c["min_ratio_asym"],
                     c["same_tokens"]))
            for e in c["wire_per_token"]:
                print("    %s per token: %.1f KB sent, %.1f KB received, %.1f requests, "
                      "rtt %.2f ms" % (e["address"], e["kb_sent_per_token"],
                                       e["kb_received_per_token"], e["requests_per_token"],
                                       e["rtt_ms"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
        print("wrote", a.json)


if __name__ == "__main__":
    main()
