#!/usr/bin/env python3
"""The cluster grid (issue 33; protocol and results in docs/BENCHMARKS.md
"The cluster at DeepSeek-V3 widths").

Every cell: the coordinator and N shoal-workers, each in its own network
namespace behind a link shaped to RATE (tbf on both ends; the
coordinator's link carries all its traffic, as one NIC on a switched LAN
does) with a round trip of RTT (tests/cluster/delayproxy.py in the root
namespace delays each direction by RTT/2: this kernel has no netem), each
worker reading its
--shard of the container through a blkio-throttled disk with an expert
cache smaller than its shard, page cache dropped, O_DIRECT. The coordinator
runs `shoal bench --state cold` (one process, one prompt) and the cell
prints, per token of each phase:

  tok/s; wire KB each way and its ratio to the f32 rows the placement
  needed (the protocol's minimum); layer round trips; worker SSD MB; and
  the bounds: disks (worker SSD bytes / the workers' summed throttle),
  link (the coordinator NIC's larger direction / RATE + round trips x RTT;
  in decode plus the cores' time, as one sequence's layer rounds, their
  bytes and their compute form one dependency chain), cores (the
  coordinator's own compute measured in the run (attention, router, dense
  MLP, shared expert, combine, head), plus, warm, the slowest
  worker's busy time of each layer step as measured, cold, the routed
  expert bytes computed at --compute-gbps); the binding one is the largest,
  and ratio = binding bound / measured time (1.0 = at the bound).
  Beside them the step floor: a layer step waits for its busiest disk and
  an expert's read is not split, so each step's worker reads (shoal bench
  step_reads_*) take at least the time of giving each read to the disk
  that would finish it first; in decode plus the coordinator's own
  compute, on the same chain. Only a prefetch of the next layer's experts
  (a guess) can go below it. The busy max/mean has a floor of the same
  kind, printed beside it: a step of m reads on n equal disks is at best
  ceil(m/n) / (m/n) (5 reads on 4 disks: 1.6).

Needs root. Usage:
  /usr/bin/python3 bench/cluster_grid.py --plot OUT.png --from A.json B.json ...
  sudo /usr/bin/python3 bench/cluster_grid.py --build build --model DIR \\
      [--workers 1,2,4] [--rate 1gbit,10gbit] [--rtt-ms 0.1,2] \\
      [--disk-mbps 150] [--cache 1500M] [--prompt-len 8] [--gen 6] \\
      [--state cold|warm] [--replicas 1] [--hot-replicas H[:X]] [--skew 1] \\
      [--equal-shares] [--local-experts off|on] [--compute-gbps 12] [--json OUT]
--skew F makes worker 0's disk F times the others' (a fast machine beside
slow ones) and gives it F times their share of the experts
(--shard-weights; --equal-shares keeps the shares equal). The model:
`shoal synth --family deepseek_v3 --layers 5 --experts int4a8 --dense int4a8
--gb 30` (1 dense + 4 MoE layers at V3's widths).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "cluster"))
sys.path.insert(0, HERE)
import benchlib as bl  # noqa: E402
import netlab  # noqa: E402

log = bl.log
RATE_BITS = {"mbit": 1e6, "gbit": 1e9}


def rate_bps(text):
    """'2.5gbit' -> bytes per second."""
    m = re.fullmatch(r"([0-9.]+)(mbit|gbit)", text)
    if not m:
        raise SystemExit("cluster_grid: rate %r: expected like 1gbit or 2.5gbit" % text)
    return float(m.group(1)) * RATE_BITS[m.group(2)] / 8


def model_shape(model):
    cfg = json.load(open(os.path.join(model, "config.json")))
    meta = {}
    p = os.path.join(model, "shoal.json")
    if os.path.exists(p):
        meta = json.load(open(p))
    n_layer = cfg.get("num_hidden_layers")
    dense = cfg.get("first_k_dense_replace", 0)
    return {"n_embd": cfg.get("hidden_size"), "n_moe": n_layer - dense,
            "top_k": cfg.get("num_experts_per_tok"), "meta": meta,
            "n_expert": cfg.get("n_routed_experts") or cfg.get("num_experts") or
            cfg.get("num_local_experts")}


def blob_bytes(model):
    """Bytes of one routed expert (`shoal inspect`'s "per expert" line)."""
    r = subprocess.run([os.path.join(ARGS.build, "coordinator", "shoal"), "inspect", model],
                       capture_output=True, text=True)
    m = re.search(r"per expert\s+(\d+) bytes", r.stdout + r.stderr)
    return int(m.group(1)) if m else None


class Cell:
    def __init__(self, n_workers, rate, rtt_ms, key, workdir):
        self.n, self.rate, self.rtt_ms, self.key, self.dir = n_workers, rate, rtt_ms, key, workdir

    def name(self):
        return "%d worker%s, %s, rtt %g ms" % (self.n, "" if self.n == 1 else "s", self.rate,
                                               self.rtt_ms)

    def run(self):
        a = ARGS
        bl.drop_caches()
        shoal = os.path.join(a.build, "coordinator", "shoal")
        worker = os.path.join(a.build, "worker", "shoal-worker")
        env = dict(os.environ)
        with netlab.Lab(prefix="shoalg%d" % os.getpid()) as lab:
            lab.route_between()
            coord = lab.add_host("c", rate=self.rate)
            hosts = [lab.add_host("w%d" % i, rate=self.rate) for i in range(self.n)]
            procs, addrs = [], []
            for i, h in enumerate(hosts):
                mbps = a.disk_mbps * (a.skew if i == 0 else 1.0)
                lp = os.path.join(self.dir, "w%d.log" % i)
                cmd = [worker, "--model", a.model, "--listen", "%s:7070" % h.addr,
                       "--cluster-key", self.key, "--direct", "on", "--expert-cache", a.cache, "--stats",
                       "--shard", "%d/%d:%d" % (i, self.n, min(ARGS.replicas, self.n))]
                if a.skew != 1 and self.n > 1 and not a.equal_shares:
                    cmd += ["--shard-weights",
                            ",".join([str(a.skew)] + ["1"] * (self.n - 1))]
                if a.hot_replicas and self.n > 1:
                    cmd += ["--hot-replicas", a.hot_replicas]
                with open(lp, "w") as lf:
                    lf.write("# %s (disk %.0f MB/s)\n" % (" ".join(cmd), mbps))
                    lf.flush()
                    procs.append(h.popen(cmd, blkio_bps=int(mbps * 1e6), stdout=lf,
                                         stderr=subprocess.STDOUT, env=env))
            for p, i in zip(procs, range(self.n)):
                bl._wait_ready(p, os.path.join(self.dir, "w%d.log" % i), 600)
            # the round trip: a delaying forwarder per worker, on the root
            # side of its link (the coordinator reaches it through its own)
            addrs = []
            for i, h in enumerate(hosts):
                px = subprocess.Popen(
                    ["/usr/bin/python3", os.path.join(ROOT, "tests", "cluster", "delayproxy.py"),
                     "%s:7071" % h.gateway, "%s:7070" % h.addr, str(self.rtt_ms / 2)],
                    stdout=subprocess.PIPE, text=True, start_new_session=True)
                lab.procs.append(px)
                if px.stdout.readline().strip() != "listening":
                    raise RuntimeError("delayproxy for %s did not start" % h.addr)
                addrs.append("%s:7071" % h.gateway)
            out = os.path.join(self.dir, "bench.json")
            cmd = [shoal, "bench", "--model", a.model, "--workers", ",".join(addrs),
                   "--cluster-key", self.key, "--local-experts", a.local_experts,
                   "--state", a.state,
                   "--reps", "1", "--limits", "off", "--prompt-len", str(a.prompt_len),
                   "--gen", str(a.gen), "--connect-timeout", "60", "--json", out]
            blkio = None
            if a.local_experts == "on":
                # the coordinator's own store: one more disk, throttled and
                # cached as a worker's
                cmd += ["--expert-cache", a.cache, "--direct", "on"]
                blkio = int(a.disk_mbps * 1e6)
            with open(os.path.join(self.dir, "coordinator.log"), "w") as lf:
                lf.write("# %s\n" % " ".join(cmd))
                lf.flush()
                cp = coord.popen(cmd, blkio_bps=blkio, stdout=lf, stderr=subprocess.STDOUT,
                                 env=env)
                try:
                    rc = cp.wait(timeout=a.timeout)
                except subprocess.TimeoutExpired:
                    cp.kill()
                    rc = cp.wait()
            for p in procs:   # SIGTERM: each worker logs its store's counters (--stats)
                p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            if rc != 0:
                raise RuntimeError("shoal bench failed (%d): see %s" % (
                    rc, os.path.join(self.dir, "coordinator.log")))
            return json.load(open(out))


def disk_rates(n):
    """Bytes/s of each disk a cell reads experts from: the n workers'
    (worker 0 --skew times the others), and with --local-experts on the
    coordinator's, throttled as a worker's."""
    rates = [ARGS.disk_mbps * 1e6 * (ARGS.skew if i == 0 else 1) for i in range(n)]
    if ARGS.local_experts == "on":
        rates.append(ARGS.disk_mbps * 1e6)
    return rates


def step_floor(m, n, blob):
    """Seconds the m expert reads of one layer step take at best on the n
    workers' throttled disks (worker 0 --skew times the others): reads of
    one size, each given to the disk that would finish it first, which is
    optimal for jobs of one size on machines of different speeds."""
    rates = disk_rates(n)
    done = [0.0] * len(rates)
    for _ in range(m):
        i = min(range(len(rates)), key=lambda k: done[k] + blob / rates[k])
        done[i] += blob / rates[i]
    return max(done)


def busy_floor(hist, n):
    """The least busy max/mean (shoal bench's busy_max_mean_*: per layer
    step the slowest worker's busy seconds over the mean of the n workers,
    averaged over steps) that the steps' worker reads allow, reads being
    indivisible and each given to the disk that would finish it first (as
    step_floor). A step of m reads on n equal disks cannot do better than
    ceil(m/n) / (m/n): 5 reads on 4 disks 1.6, 6 reads 1.33. A step with no
    read counts 1 (its computes are not modelled)."""
    steps = total = 0
    for m, c in hist.items():
        m, c = int(m), int(c)
        ratio = 1.0
        if m > 0:
            rates = disk_rates(n)
            done = [0.0] * len(rates)
            for _ in range(m):
                i = min(range(len(rates)), key=lambda k: done[k] + 1 / rates[k])
                done[i] += 1 / rates[i]
            ratio = max(done) / (sum(done) / len(rates))
        steps += c
        total += c * ratio
    return total / steps if steps else None


def figures(res, cell, shape, blob):
    """The per-token figures and bounds of one cell's `shoal bench` JSON."""
    run = res["runs"][0] if "runs" in res else res
    f = run["figures"]
    ph = run["phases"]
    rate = rate_bps(cell.rate)
    out = {}
    for phase in ("prefill", "decode"):
        p = ph[phase]
        tok = max(1, p["tokens"])
        t_meas = p["seconds"] / tok
        sent = f.get("%s_wire_sent_kb_per_token" % phase, 0) * 1e3
        recv = f.get("%s_wire_received_kb_per_token" % phase, 0) * 1e3
        rt = f.get("%s_round_trips_per_token" % phase, 0)
        ssd = f.get("%s_worker_ssd_mb_per_token" % phase, 0) * 1e6
        disks = sum(disk_rates(cell.n))
        t_disk = ssd / disks
        t_link = max(sent, recv) / rate + rt * cell.rtt_ms / 1e3
        # the coordinator's own compute: attention, router, combine, head,
        # and of "experts" what is not the routed batch-union's wait (the
        # dense layers' MLP and the shared expert)
        own = (p["attention"] + p["routing"] + p["combine"] + p["head"] +
               max(0.0, p["experts"] - p.get("expert_wait", p["experts"]))) / tok
        # the workers' busy seconds (read + compute) of this phase's layer
        # steps, and the slowest one's share of each step
        ex = run.get("executors_" + phase) or []
        busy = sum(e.get("busy_s", 0) for e in ex)
        steps = sum(e.get("busy_steps", 0) for e in ex)
        balance = f.get("busy_max_mean_" + phase)
        if ARGS.state == "warm" and steps and balance:
            # experts in RAM: busy is compute; the slowest worker of each
            # step is on the chain
            t_cores = own + rt * balance * busy / steps
            cores_how = "measured"
        else:
            # decode: top_k experts per MoE layer per token; prefill: the
            # union is at most every expert of a layer once per chunk
            routed = shape["n_moe"] * shape["top_k"] * blob if blob else 0
            if phase == "prefill" and blob:
                routed = min(routed, shape["n_moe"] * shape["n_expert"] * blob / tok)
            t_cores = own + routed / (ARGS.compute_gbps * 1e9)
            cores_how = "modelled"
        if phase == "decode":
            # one sequence: a layer's round trip, its rows on the wire and
            # the compute on both ends lie on one dependency chain; nothing
            # of the next layer can start before they end
            t_link += t_cores
        bounds = {"disks": t_disk, "link": t_link, "cores": t_cores}
        binding = max(bounds, key=bounds.get)
        # the step floor: a layer step waits for its busiest disk and an
        # expert's read is not split, so a step's m worker reads take at
        # least step_floor(m) (each read to the disk that would finish it
        # first); summed over the steps (shoal bench's step_reads_*), per
        # token
        hist = f.get("step_reads_" + phase)
        t_steps = None
        if hist is not None and blob:
            t_steps = sum(step_floor(int(m), cell.n, blob) * c for m, c in hist.items()) / tok
            if phase == "decode":
                # one sequence: the coordinator's own compute lies on the
                # same chain as the reads (only a prefetch of the next
                # layer's experts, a guess, could overlap them)
                t_steps += own
        out[phase] = {
            "tok_s": 1.0 / t_meas if t_meas > 0 else None,
            "wire_kb_sent": sent / 1e3, "wire_kb_received": recv / 1e3,
            "wire_over_min": f.get("%s_wire_over_minimum" % phase),
            "round_trips": rt, "ssd_mb": ssd / 1e6, "busy_max_mean": balance,
            "busy_floor": busy_floor(hist, cell.n) if hist else None,
            "cores_bound": cores_how,
            "bound_ms": {k: v * 1e3 for k, v in bounds.items()},
            "binding": binding,
            "ratio": bounds[binding] / t_meas if t_meas > 0 else None,
            "worker_reads": f.get("worker_reads_" + phase),
            "own_ms": own * 1e3,
            "step_floor_ms": t_steps * 1e3 if t_steps is not None else None,
            "of_step_floor": max(t_steps, bounds[binding]) / t_meas
            if t_steps is not None and t_meas > 0 else None,
        }
    return out


def plot(paths, out):
    """One picture of grid JSONs: each cell's decode and prefill tok/s as
    bars, the binding bound's tok/s as a tick above each, the ratio written
    on it."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker
    cells = []
    for p in paths:
        d = json.load(open(p))
        a = d["args"]
        tag = a.get("state", "cold")
        if a.get("hot_replicas"):
            tag += ", hot " + a["hot_replicas"]
        if a.get("replicas", 1) > 1:
            tag += ", R=%d" % a["replicas"]
        if a.get("skew", 1) != 1:
            tag += ", disks %g:1%s" % (a["skew"], " equal shares" if a.get("equal_shares", True)
                                       else "")
        if a.get("prompt_len", 8) != 8:
            tag += ", prompt %d" % a["prompt_len"]
        for c in d["cells"]:
            g = c["figures"]["decode"]
            if g.get("step_floor_ms") is not None and "own_ms" not in g and \
                    g.get("cores_bound") == "modelled":
                # grid JSONs from before the decode floor counted the
                # coordinator's own compute: it is the modelled cores bound
                # less the routed experts' compute
                sh = d["shape"]
                routed = sh["n_moe"] * sh["top_k"] * d["blob_bytes"] / (a["compute_gbps"] * 1e9)
                g["step_floor_ms"] += g["bound_ms"]["cores"] - routed * 1e3
            cells.append(("%dw %s\n%gms %s" % (c["workers"], c["rate"], c["rtt_ms"], tag), c))
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 0.55 * len(cells)), 7), sharex=True)
    for ax, phase in zip(axes, ("decode", "prefill")):
        xs = range(len(cells))
        got = [c["figures"][phase]["tok_s"] for _, c in cells]
        bound = [1e3 / c["figures"][phase]["bound_ms"][c["figures"][phase]["binding"]]
                 for _, c in cells]
        colors = {"disks": "#4c72b0", "link": "#dd8452", "cores": "#55a868"}
        ax.bar(xs, got, color=[colors[c["figures"][phase]["binding"]] for _, c in cells])
        ax.scatter(xs, bound, marker="_", s=300, color="black", zorder=3)
        fl = [(x, 1e3 / c["figures"][phase]["step_floor_ms"]) for x, (_, c) in zip(xs, cells)
              if c["figures"][phase].get("step_floor_ms")]
        if fl:
            ax.scatter([x for x, _ in fl], [v for _, v in fl], marker="_", s=300, color="grey",
                       linestyle="--", zorder=3)
        floor = dict(fl)
        for x, g, b in zip(xs, got, bound):
            ax.text(x, max(g, b, floor.get(x, 0)) * 1.05, "%.2f" % (g / b), ha="center",
                    fontsize=7)
        ax.set_yscale("log")
        top = max(max(got), max(bound), max(floor.values(), default=0)) * 1.6
        ax.set_ylim(bottom=min(got) / 1.3, top=top)
        # plain numbers at 1, 2, 5 of each decade, so that a range within
        # one decade still reads (the default labels only the decades)
        ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: "%g" % v))
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax.grid(axis="y", which="major", color="#dddddd", linewidth=0.6, zorder=0)
        ax.set_axisbelow(True)
        ax.set_ylabel("%s tok/s" % phase)
    axes[0].set_title("shoal cluster at DeepSeek-V3 widths: tok/s measured (bars) against the "
                      "binding bound (black tick), ratio above;\nthe step floor (grey tick); "
                      "the bound that binds: blue disks, orange link\n(decode: with the compute "
                      "on each layer's round trip), green cores", fontsize=9)
    axes[1].set_xticks(range(len(cells)))
    axes[1].set_xticklabels([n for n, _ in cells], rotation=90, fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print("cluster_grid: wrote %s" % out)


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--model")
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--rtt-ms", default="0.1")
    ap.add_argument("--disk-mbps", type=float, default=150)
    ap.add_argument("--skew", type=float, default=1.0)
    ap.add_argument("--equal-shares", action="store_true",
                    help="with --skew: equal shards (default: --shard-weights by disk)")
    ap.add_argument("--hot-replicas", default=None,
                    help="H[:X]: shoal-worker --hot-replicas (with 2 workers or more)")
    ap.add_argument("--state", choices=("cold", "warm"), default="cold",
                    help="warm: after one unmeasured pass (a cache as large as the "
                         "shard then holds it all: the links and cores alone)")
    ap.add_argument("--replicas", type=int, default=1,
                    help="holders of each expert (--shard I/N:R, at most N)")
    ap.add_argument("--cache", default="1500M")
    ap.add_argument("--local-experts", choices=("off", "on"), default="off",
                    help="on: the coordinator's own store executes experts too, "
                         "reading through a disk throttled as a worker's")
    ap.add_argument("--prompt-len", type=int, default=8)
    ap.add_argument("--gen", type=int, default=6)
    ap.add_argument("--compute-gbps", type=float, default=12.0,
                    help="routed expert bytes this machine computes per second "
                         "(kernel_bench's paired figure at all threads)")
    ap.add_argument("--timeout", type=int, default=3600)
    ap.add_argument("--workdir", default="/tmp/cluster_grid")
    ap.add_argument("--json")
    ap.add_argument("--plot", metavar="PNG",
                    help="draw the JSONs of --from (earlier runs) into PNG and exit")
    ap.add_argument("--from", dest="sources", nargs="+", default=[])
    ARGS = ap.parse_args()
    if ARGS.plot:
        plot(ARGS.sources, ARGS.plot)
        return 0
    if not ARGS.model:
        ap.error("--model DIR is required (or --plot PNG --from JSON...)")
    ok, why = netlab.Lab.available()
    if not ok:
        print("cluster_grid: skipped: %s" % why)
        return 0
    key = bl.write_cluster_key(ARGS.workdir)
    shape = model_shape(ARGS.model)
    blob = blob_bytes(ARGS.model)
    results = []
    print("| workers | link | RTT | phase | tok/s | wire KB/token sent / received | "
          "wire / minimum | round trips / token | worker SSD MB/token | busy max/mean (floor) | "
          "bounds ms/token (disks, link, cores) | binding | measured / bound | "
          "step floor ms/token | measured / max(bound, floor) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in [int(x) for x in ARGS.workers.split(",")]:
        for rate in ARGS.rate.split(","):
            for rtt in [float(x) for x in ARGS.rtt_ms.split(",")]:
                cell = Cell(n, rate, rtt, key, os.path.join(
                    ARGS.workdir, "%dw-%s-%gms" % (n, rate, rtt)))
                os.makedirs(cell.dir, exist_ok=True)
                log("cell: %s" % cell.name())
                t0 = time.time()
                res = cell.run()
                fig = figures(res, cell, shape, blob)
                results.append({"workers": n, "rate": rate, "rtt_ms": rtt,
                                "seconds": time.time() - t0, "figures": fig})
                for phase in ("prefill", "decode"):
                    g = fig[phase]
                    b = g["bound_ms"]
                    fl = g["step_floor_ms"]
                    print("| %d | %s | %g ms | %s | %.2f | %.0f / %.0f | %s | %.2f | %.0f | %s | "
                          "%.0f, %.0f, %.0f | %s | %.2f | %s | %s |" % (
                              n, rate, rtt, phase, g["tok_s"], g["wire_kb_sent"],
                              g["wire_kb_received"],
                              "%.3f" % g["wire_over_min"] if g["wire_over_min"] else "-",
                              g["round_trips"], g["ssd_mb"],
                              ("%.2f" % g["busy_max_mean"] if g["busy_max_mean"] else "-") +
                              (" (%.2f)" % g["busy_floor"] if g.get("busy_floor") else ""),
                              b["disks"], b["link"],
                              b["cores"], g["binding"], g["ratio"],
                              "%.0f" % fl if fl is not None else "-",
                              "%.2f" % g["of_step_floor"] if fl is not None else "-"),
                          flush=True)
    if ARGS.json:
        with open(ARGS.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "model": ARGS.model,
                       "args": vars(ARGS), "blob_bytes": blob, "shape": shape,
                       "cells": results}, f, indent=1)
    return 0


ARGS = None
if __name__ == "__main__":
    sys.exit(main())
