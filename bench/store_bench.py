#!/usr/bin/env python3
"""The expert store benchmark (issue 4; protocol in docs/BENCHMARKS.md).

In one run, on one machine, against one container:
  (a) fio: random O_DIRECT reads of one expert blob each, on experts.bin
      itself, at queue depths 1, 2, 4, 8 (and the engine's): the SSD limit
  (b) ram_probe (bench/ram_probe.c): STREAM-like read / copy / triad at 1 and
      2 threads: the RAM limit
  (c) cold decode: page cache dropped, --direct on, --expert-cache <= 1/8 of
      the expert bytes: expert read MB/s from --stats vs fio at the same
      request size and queue depth
  (d) warm decode: every expert read once (shoal synth --check --preload,
      cache unlimited), then a measured window: expert bytes computed per
      second of the experts stage vs the RAM probe at the same thread count
  (e) prefetch on vs off (cold): decode speed-up and prefetch recall;
      "n/a (not built)" while shoal lacks the flags
and the routing skew of the synthetic model (achieved vs target).
Every figure is printed next to its limit and as a ratio, and written to
JSON. Timing here is noisy (shared 2-core VMs): compare ratios measured in
the same run, never absolute numbers across runs.

Usage (root, for drop_caches):
  /usr/bin/python3 bench/store_bench.py --shoal build/coordinator/shoal \\
      --workdir /work/bench-data [--model DIR | --gb 8] [--json OUT.json]

Needs fio (apt-get install fio) and a C compiler with OpenMP.
"""
import argparse
import json
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

# shared with bench/sweep and bench/compare
from benchlib import (build_ram_probe, container_info, drop_caches, fio_at,  # noqa: E402
                      fio_randread, fmt, loadavg, log, machine_info, med, ram_probe, ratio, sh)


# ---- (b) RAM probe ------------------------------------------------------------------


# ---- what one read costs besides the device (bench/read_probe.c) ------------------

# glibc keeps freed blocks of any size in the heap with these (no munmap, no
# trim), so a freed expert blob's pages, already faulted in, are reused by
# the next allocation: what a store that recycles its blobs would get
KEEP_FREED = {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=67108864:"
                                "glibc.malloc.trim_threshold=4294967296"}


def build_read_probe(workdir):
    out = os.path.join(workdir, "read_probe")
    cc = os.environ.get("CC", "cc")
    r = sh([cc, "-O2", os.path.join(HERE, "read_probe.c"), "-lxxhash", "-o", out])
    return out if r.returncode == 0 else None


def read_probes(exe, ci, seconds):
    out = []
    for name, args, env in [("reused buffer", [], None), ("reused buffer + xxh64", ["--hash"], None),
                            ("fresh buffer per read + xxh64 (as the store)", ["--fresh", "--hash"], None),
                            ("64 recycled buffers + xxh64 (a blob pool)", ["--pool", "64", "--hash"], None)]:
        r = sh([exe, ci["experts_file"], "--bs", str(ci["blob_bytes"]), "--seconds", str(seconds)] + args,
               env=env)
        if r.returncode == 0:
            j = json.loads(r.stdout)
            j["name"] = name
            out.append(j)
            log("read_probe %s: %.0f MB/s (alloc %.2f, read %.2f, hash %.2f ms)" % (
                name, j["mb_per_s"], j["alloc_ms"], j["read_ms"], j["hash_ms"]))
    return out


# ---- shoal runs ---------------------------------------------------------------------

STAT_RES = {
    "acquired": r"experts: (\d+) acquired",
    "disk": r"disk (\d+) \(([\d.]+)%",
    "mb_read": r"([\d.]+) MB read",
    "read_mb_s": r"MB read at ([\d.]+) MB/s",
    "stall_ms_tok": r"stalled ([\d.]+) ms/token",
    "io": r"io (\w+), queue depth (\d+)",
    "prefetch_reads": r"prefetch: (\d+) reads",
    "precision": r"precision ([\d.]+)%",
    "recall": r"recall ([\d.]+)%",
    "decode_tok_s": r"decode (\d+) tokens, ([\d.]+) tok/s",
    "hits_misses": r"(\d+) hits, (\d+) misses",
}


def parse_stats(text):
    out = {}
    for k, rx in STAT_RES.items():
        m = re.search(rx, text)
        if not m:
            continue
        if k == "disk":
            out["disk_reads"] = int(m.group(1))
            out["miss_pct"] = float(m.group(2))
        elif k == "io":
            out["io_engine"] = m.group(1)
            out["queue_depth"] = int(m.group(2))
        elif k == "decode_tok_s":
            out["decode_tokens"] = int(m.group(1))
            out["decode_tok_s"] = float(m.group(2))
        elif k == "hits_misses":  # the first store's --stats line
            out["disk_reads"] = int(m.group(2))
            out["acquired"] = int(m.group(1)) + int(m.group(2))
            out["miss_pct"] = 100.0 * out["disk_reads"] / max(1, out["acquired"])
        elif k == "acquired" or k == "prefetch_reads":
            out[k] = int(m.group(1))
        else:
            out[k] = float(m.group(1))
    return out


def detect_flags(shoal, tiny):
    """Which store flags this shoal accepts (probe on a tiny container)."""
    flags = {}
    for name, args in [("prefetch", ["--prefetch", "off"]), ("queue_depth", ["--queue-depth", "8"]),
                       ("io", ["--io", "pread"]), ("direct", ["--direct", "on"]),
                       ("expert_cache", ["--expert-cache", "1M"]), ("stats", ["--stats"]),
                       ("pin", ["--pin", "0"])]:
        r = sh([shoal, "run", "--model", tiny, "--tokens", "1,2", "--max-tokens", "1",
                "--ignore-eos"] + args, timeout=120)
        flags[name] = r.returncode == 0 and "unknown option" not in r.stderr
    r = sh([shoal, "synth", "--help"])
    flags["synth_check"] = r.returncode == 0 and "--check" in r.stdout
    return flags


def prompt_ids(vocab, n, seed):
    rnd = random.Random(seed)
    return ",".join(str(rnd.randrange(0, vocab - 1)) for _ in range(n))


def omp_env(policy):
    return {"OMP_WAIT_POLICY": policy} if policy and policy != "default" else {}


def cold_run(shoal, ci, cache_bytes, tokens, prompt_len, flags, extra, seed, runner="run",
             isa=None, threads=None, policy="passive", env_extra=None):
    drop_caches()
    cmd = []
    if runner == "run":
        cmd = [shoal, "run", "--model", ci["dir"], "--tokens",
               prompt_ids(ci["vocab"], prompt_len, seed), "--max-tokens", str(tokens),
               "--ignore-eos", "--seed", str(seed)]
    else:
        cmd = [shoal, "synth", "--check", ci["dir"], "--prompt-len", str(prompt_len),
               "--decode", str(tokens), "--seed", str(seed), "--keep-counts"]
        if isa:
            cmd += ["--isa", isa]
    cmd += ["--direct", "on", "--expert-cache", str(cache_bytes), "--stats"]
    if threads:
        cmd += ["--threads", str(threads)]
    cmd += extra
    la0 = loadavg()
    env = omp_env(policy)
    env.update(env_extra or {})
    r = sh(cmd, timeout=3600, env=env)
    res = {"cmd": " ".join("%s=%s" % kv for kv in env.items()).strip() + (" " if env else "") +
           " ".join(cmd), "rc": r.returncode, "wall_s": r.wall, "load_before": la0,
           "load_after": loadavg()}
    if r.returncode != 0:
        res["error"] = r.stderr.strip()[-800:]
        return res
    res.update(parse_stats(r.stderr + r.stdout))
    m = re.search(r"measured: ([\d.]+) tok/s", r.stdout)
    if m:
        res["decode_tok_s"] = float(m.group(1))
    if "mb_read" in res:
        res["read_mb_s_wall"] = res["mb_read"] / r.wall
    if res.get("acquired"):
        # layer steps (every MoE layer of every routed token, about acquired / k
        # in decode) and the reads each needed: demand misses + prefetches
        steps = max(1, res["acquired"] / max(1, ci["top_k"]))
        res["misses_per_layer_step"] = res.get("disk_reads", 0) / steps
        res["reads_per_layer_step"] = (res.get("disk_reads", 0) +
                                       res.get("prefetch_reads", 0)) / steps
    return res


def warm_run(shoal, ci, tokens, warmup, threads, isa, seed, routing_out=None, policy="passive"):
    cmd = [shoal, "synth", "--check", ci["dir"], "--preload", "--direct", "on",
           "--expert-cache", "unlimited", "--warmup", str(warmup), "--decode", str(tokens),
           "--threads", str(threads), "--seed", str(seed)]
    if isa:
        cmd += ["--isa", isa]
    fd, jpath = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    cmd += ["--json", jpath]
    if routing_out:
        cmd += ["--routing-out", routing_out]
    drop_caches()
    la0 = loadavg()
    env = omp_env(policy)
    r = sh(cmd, timeout=3600, env=env)
    shown = [c for c in cmd if c != jpath and c != "--json"]
    res = {"cmd": " ".join("%s=%s" % kv for kv in env.items()).strip() + (" " if env else "") +
           " ".join(shown), "rc": r.returncode, "wall_s": r.wall, "load_before": la0,
           "load_after": loadavg(), "threads": threads, "isa": isa or "as shoal run",
           "omp_wait_policy": policy}
    if r.returncode != 0:
        res["error"] = (r.stderr or r.stdout).strip()[-800:]
    else:
        res.update(json.load(open(jpath)))
    os.unlink(jpath)
    return res


# ---- report ---------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shoal", default=os.path.join(ROOT, "build", "coordinator", "shoal"))
    ap.add_argument("--baseline-shoal", help="another shoal binary (e.g. an older store) whose "
                    "cold decode is measured on the same model in the same run")
    ap.add_argument("--baseline-name", default="baseline")
    ap.add_argument("--model", help="container to benchmark (default: synthesize one)")
    ap.add_argument("--workdir", default="/work/bench-data")
    ap.add_argument("--gb", type=float, default=8.0, help="size of the synthesized model")
    ap.add_argument("--family", default="qwen3_moe")
    ap.add_argument("--experts", default="int4a8",
                    help="expert dtype of the synthesized model (int4a8: int4 bytes computed "
                         "against int8 activations; int4: f32 activations)")
    ap.add_argument("--tokens", type=int, default=24, help="decode tokens per cold run")
    ap.add_argument("--warm-tokens", type=int, default=24, help="measured decode tokens, warm")
    ap.add_argument("--prompt-len", type=int, default=8)
    ap.add_argument("--cache-frac", type=float, default=0.125, help="cold cache / expert bytes")
    ap.add_argument("--fio-runtime", type=int, default=8)
    ap.add_argument("--fio-qd", default="1,2,4,8,16")
    ap.add_argument("--reps", type=int, default=2, help="repetitions of each cold run")
    ap.add_argument("--threads", default="1,2", help="thread counts for warm runs")
    ap.add_argument("--omp-wait", default="passive", help="OMP_WAIT_POLICY for shoal runs "
                    "(passive, active or default = unset)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--routing-tokens", type=int, default=128,
                    help="decode tokens of the routing measurement")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--skip", default="", help="comma list of: fio,ram,readprobe,cold,warm,"
                    "prefetch,baseline,routing")
    a = ap.parse_args()
    skip = set(x for x in a.skip.split(",") if x)
    shoal = os.path.abspath(a.shoal)
    os.makedirs(a.workdir, exist_ok=True)
    res = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "load_start": loadavg(),
           "argv": sys.argv}
    res["machine"] = machine_info(a.workdir)
    r = sh([shoal, "--version"])
    res["shoal"] = {"path": shoal, "version": r.stdout.strip(), "omp_wait_policy": a.omp_wait}
    if shutil.which("fio") is None and "fio" not in skip:
        log("fio is not installed (apt-get install fio); skipping (a)")
        skip.add("fio")
    threads = sorted(set(int(x) for x in a.threads.split(",")))

    # the container
    model = a.model
    if not model:
        model = os.path.join(a.workdir, "%s-%gg-%s" % (a.family, a.gb, a.experts))
        if not os.path.exists(os.path.join(model, "shoal.json")):
            log("synthesizing %s (%g GB)..." % (model, a.gb))
            cmd = ["nice", shoal, "synth", model, "--gb", str(a.gb), "--family", a.family,
                   "--experts", a.experts, "--force"]
            r = sh(cmd, timeout=7200)
            if r.returncode != 0:
                log(r.stderr)
                return 1
            log(r.stderr.strip())
    ci = container_info(model)
    res["container"] = ci
    blob, qd_engine = ci["blob_bytes"], 8
    tiny = os.path.join(a.workdir, "tiny-flags")
    if not os.path.exists(os.path.join(tiny, "shoal.json")):
        sh([shoal, "synth", tiny, "--gb", "0.005", "--trace", "uniform", "--force"], check=True)
    flags = detect_flags(shoal, tiny)
    res["flags"] = flags
    log("flags: %s" % flags)
    base = os.path.abspath(a.baseline_shoal) if a.baseline_shoal and "baseline" not in skip else None
    if base:
        res["baseline"] = {"path": base, "name": a.baseline_name, "flags": detect_flags(base, tiny)}

    # (a) fio, a first pass now and a second at the end: the figure is the
    # median of the passes, their spread is reported
    fio = {}
    fio_qds = sorted(set(int(x) for x in a.fio_qd.split(",")) | {qd_engine})

    def fio_pass(tag):
        for qd in fio_qds:
            eng = "psync" if qd == 1 else "io_uring"
            log("fio randread bs=%d qd=%d (%s), %s..." % (blob, qd, eng, tag))
            f = fio_randread(ci["experts_file"], blob, ci["experts_file_bytes"], qd,
                             a.fio_runtime, eng)
            log("  %.0f MB/s" % f.get("mb_per_s", 0))
            fio.setdefault(qd, {"qd": qd, "engine": eng, "bs": blob, "passes": []})
            fio[qd]["passes"].append(f)
            ok_ = [p["mb_per_s"] for p in fio[qd]["passes"] if "mb_per_s" in p]
            if ok_:
                fio[qd]["mb_per_s"] = statistics.median(ok_)
                fio[qd]["min"], fio[qd]["max"] = min(ok_), max(ok_)
                fio[qd]["clat_ms_mean"] = statistics.median(
                    p["clat_ms_mean"] for p in fio[qd]["passes"] if "clat_ms_mean" in p)
                fio[qd]["cmd"] = f.get("cmd")

    if "fio" not in skip:
        fio_pass("pass 1")

    # (b) RAM probe
    ram = {}
    if "ram" not in skip:
        exe = build_ram_probe(a.workdir)
        for t in threads:
            best = None
            for _ in range(2):
                p = ram_probe(exe, t)
                if best is None or p["triad_gbs"] > best["triad_gbs"]:
                    best = p
            ram[t] = best
            log("ram probe %d threads: read %.1f, copy %.1f, triad %.1f GB/s" %
                (t, best["read_gbs"], best["copy_gbs"], best["triad_gbs"]))
    res["ram"] = {str(k): v for k, v in ram.items()}
    res["read_probe"] = []
    if "readprobe" not in skip:
        rp = build_read_probe(a.workdir)
        if rp:
            drop_caches()
            res["read_probe"] = read_probes(rp, ci, min(6, a.fio_runtime))
        else:
            log("read_probe does not build (needs libxxhash-dev); skipped")

    # (c) cold decode, (e) prefetch on/off, and the baseline binary
    cache = int(ci["expert_bytes"] * a.cache_frac) // blob * blob
    cold = []
    KEPT = "freed blob memory kept (GLIBC_TUNABLES)"

    def do_cold(binary, name, extra, rep, **kw):
        kw.setdefault("env_extra", None)
        log("cold decode (%s), rep %d..." % (name, rep + 1))
        c = cold_run(binary, ci, cache, a.tokens, a.prompt_len, flags, extra, a.seed + rep,
                     policy=a.omp_wait, **kw)
        c["conf"] = name
        c["rep"] = rep
        cold.append(c)
        log("  %s" % {k: c.get(k) for k in ("decode_tok_s", "read_mb_s", "miss_pct", "recall",
                                             "stall_ms_tok", "misses_per_layer_step", "error")})

    if "cold" not in skip:
        confs = [("default", [])]
        if flags.get("prefetch") and "prefetch" not in skip:
            confs = [("prefetch on", ["--prefetch", "on"]), ("prefetch off", ["--prefetch", "off"])]
        for rep in range(a.reps):
            order = confs if rep % 2 == 0 else list(reversed(confs))
            for name, extra in order:
                do_cold(shoal, name, extra, rep)
            do_cold(shoal, KEPT, confs[0][1], rep, env_extra=KEEP_FREED)
            if base:
                do_cold(base, a.baseline_name, [], rep)
    res["cold"] = cold

    # (d) warm decode
    warm = []
    if "warm" not in skip and flags.get("synth_check"):
        confs = [(t, None, a.omp_wait) for t in threads] + [(min(threads), "scalar", a.omp_wait)]
        if a.omp_wait != "default" and max(threads) > 1:
            confs.append((max(threads), None, "default"))
        for t, isa, pol in confs:
            log("warm decode, %d threads, kernels %s, OMP_WAIT_POLICY %s..." % (
                t, isa or "as shoal run", pol))
            w = warm_run(shoal, ci, a.warm_tokens, 4, t, isa, a.seed, policy=pol)
            warm.append(w)
            log("  %s" % {k: w.get(k) for k in ("quant_kernels", "expert_bytes_per_s_stage",
                                                 "expert_bytes_per_s_wall", "error")})
    res["warm"] = warm
    if "fio" not in skip:
        fio_pass("pass 2")
    res["fio"] = {str(k): v for k, v in fio.items()}

    # (f) routing of the synthetic model: achieved vs target expert shares
    routing = None
    if "routing" not in skip and flags.get("synth_check") and "synth" in ci:
        rpath = os.path.join(a.workdir, "routing.json")
        fd, jpath = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        cmd = [shoal, "synth", "--check", ci["dir"], "--isa", "auto", "--threads", "1",
               "--prompt-len", "32", "--decode", str(a.routing_tokens), "--direct", "on",
               "--expert-cache", str(4 * cache), "--seed", str(a.seed), "--routing-out", rpath]
        log("routing: %d decode tokens..." % a.routing_tokens)
        env = omp_env(a.omp_wait)
        r = sh(cmd + ["--json", jpath], timeout=3600, env=env)
        cmd = ["%s=%s" % kv for kv in env.items()] + cmd
        if r.returncode == 0 and os.path.exists(rpath):
            j = json.load(open(jpath))
            d = json.load(open(rpath))
            # rank-frequency curve: experts ordered by target share within each
            # layer, achieved and target averaged over layers, cumulated
            n = len(d["layers"][0]["target"])
            acc_t, acc_a = [0.0] * n, [0.0] * n
            for L in d["layers"]:
                order = sorted(range(n), key=lambda e: -L["target"][e])
                for rank, e in enumerate(order):
                    acc_t[rank] += L["target"][e] / len(d["layers"])
                    acc_a[rank] += L["achieved"][e] / len(d["layers"])
            cum = {}
            for k in sorted(set([1, max(1, n // 16), max(1, n // 8), n // 4, n // 2])):
                cum[str(k)] = {"target": sum(acc_t[:k]), "achieved": sum(acc_a[:k]),
                               "uniform": k / n}
            routing = {"cmd": " ".join(cmd), "summary": j.get("routing"), "cumulative_by_target_rank": cum,
                       "detail": rpath, "layers": len(d["layers"])}
            log("  %s" % j.get("routing"))
        else:
            routing = {"cmd": " ".join(cmd), "error": (r.stderr or r.stdout).strip()[-800:]}
        os.unlink(jpath)
    res["routing"] = routing
    res["load_end"] = loadavg()
    res["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")

    # ---- summary
    rows = []

    def row(name, value, unit, limit, limit_name, target=None):
        rows.append({"figure": name, "value": value, "unit": unit, "limit": limit,
                     "limit_name": limit_name, "ratio": ratio(value, limit), "target": target})

    fio_q = lambda q: fio.get(q, {}).get("mb_per_s")
    ok = lambda c: "error" not in c
    on = [c for c in cold if c.get("conf") in ("prefetch on", "default") and ok(c)]
    off = [c for c in cold if c.get("conf") == "prefetch off" and ok(c)]
    bl = [c for c in cold if c.get("conf") == a.baseline_name and ok(c)]
    kept = [c for c in cold if c.get("conf") == KEPT and ok(c)]
    if on:
        qd = on[0].get("queue_depth", qd_engine)
        rd = med([c.get("read_mb_s") for c in on])
        mpl = med([c.get("reads_per_layer_step") for c in on])
        row("cold: expert reads MB/s while reading (--stats)", rd, "MB/s", fio_q(qd),
            "fio QD%d (engine's depth)" % qd, 0.8)
        row("cold: same vs fio at the reads per layer (QD %.1f)" % (mpl or 0), rd, "MB/s",
            fio_at(fio, mpl), "fio QD%.1f, interpolated" % (mpl or 0))
        row("cold: same vs fio QD1", rd, "MB/s", fio_q(1), "fio QD1 (psync)")
        row("cold: expert MB read / process wall time", med([c.get("read_mb_s_wall") for c in on]),
            "MB/s", fio_q(qd), "fio QD%d" % qd)
        res["cold_reads_per_layer_step"] = mpl
    if bl:
        row("cold, %s: expert reads MB/s (--stats)" % a.baseline_name,
            med([c.get("read_mb_s") for c in bl]), "MB/s", fio_q(1), "fio QD1 (psync)")
        row("cold, %s: decode tok/s vs this build" % a.baseline_name,
            med([c.get("decode_tok_s") for c in bl]), "tok/s",
            med([c.get("decode_tok_s") for c in on]), "this build (prefetch on)")
    if kept:
        qd = kept[0].get("queue_depth", qd_engine)
        row("cold, freed blobs kept: expert reads MB/s (--stats)", med([c.get("read_mb_s") for c in kept]),
            "MB/s", fio_q(qd), "fio QD%d" % qd, 0.8)
        row("cold, freed blobs kept: decode tok/s vs as built", med([c.get("decode_tok_s") for c in kept]),
            "tok/s", med([c.get("decode_tok_s") for c in on]), "as built")
    for w in warm:
        if not ok(w):
            continue
        t = w["threads"]
        lim = ram.get(t, {})
        tag = "%d thr, %s%s" % (t, w.get("quant_kernels"),
                                ", OMP wait %s" % w["omp_wait_policy"] if w["omp_wait_policy"] != a.omp_wait else "")
        # the target is the machine's: all its threads, the kernels shoal
        # picks, the wait policy asked for; other rows are for comparison
        headline = (t == max(threads) and w.get("isa") == "as shoal run" and
                    w["omp_wait_policy"] == a.omp_wait)
        row("warm: expert bytes/s, experts stage (%s)" % tag,
            w.get("expert_bytes_per_s_stage", 0) / 1e6, "MB/s",
            lim.get("triad_gbs", 0) * 1e3 or None, "RAM triad %d thr" % t,
            0.5 if headline else None)
        # DESIGN section 6 names a STREAM-like copy as the RAM limit; a
        # matvec only reads its weights, so the read probe is its own access
        # pattern; the triad (STREAM's headline) mixes in writes. All shown.
        row("warm: same vs RAM copy probe", w.get("expert_bytes_per_s_stage", 0) / 1e6, "MB/s",
            lim.get("copy_gbs", 0) * 1e3 or None, "RAM copy %d thr" % t,
            0.5 if headline else None)
        row("warm: same vs RAM read probe", w.get("expert_bytes_per_s_stage", 0) / 1e6, "MB/s",
            lim.get("read_gbs", 0) * 1e3 or None, "RAM read %d thr" % t,
            0.5 if headline else None)
        row("warm: expert bytes/s over decode wall (%s)" % tag,
            w.get("expert_bytes_per_s_wall", 0) / 1e6, "MB/s",
            lim.get("triad_gbs", 0) * 1e3 or None, "RAM triad %d thr" % t)
    if off and on:
        s_on, s_off = med([c.get("decode_tok_s") for c in on]), med([c.get("decode_tok_s") for c in off])
        row("prefetch: decode tok/s, on vs off", s_on, "tok/s", s_off, "prefetch off")
        row("prefetch: recall (used experts that were hinted)", med([c.get("recall") for c in on]),
            "%", 100.0, "all hinted")
        row("prefetch: precision (prefetched and used)", med([c.get("precision") for c in on]),
            "%", 100.0, "all used")
    else:
        why = "n/a (not run)" if "cold" in skip or "prefetch" in skip else "n/a (not built)"
        rows.append({"figure": "prefetch on vs off, recall", "value": None, "unit": "",
                     "limit": None, "limit_name": why, "ratio": None, "target": None})
    if routing and routing.get("summary"):
        rt = routing["summary"]
        for k, v in routing["cumulative_by_target_rank"].items():
            row("routing: slots of the %s experts hottest by target" % k, 100 * v["achieved"], "%",
                100 * v["target"], "target (uniform %.1f%%)" % (100 * v["uniform"]))
        row("routing: total variation per layer, achieved vs target", rt["tv"], "", rt["tv_noise"],
            "sampling floor")
    res["summary"] = rows

    m = res["machine"]
    print("store_bench: %s, %s cores, %s GiB RAM, %s %s (%s), commit %s%s; load %s -> %s" % (
        m.get("cpu"), m.get("cores"), m.get("ram_gib"), m.get("device"), m.get("fs"),
        m.get("disk"), m.get("commit"), "+dirty" if m.get("dirty") else "", res["load_start"],
        res["load_end"]))
    print("model: %s, %s experts x %d layers, top-%d, blob %d bytes (%s), experts %.2f GB; cold "
          "cache %.2f GB" % (ci["model_type"], ci["n_expert"], ci["n_moe_layers"], ci["top_k"],
                             blob, ci["experts_dtype"], ci["expert_bytes"] / 1e9, cache / 1e9))
    if "synth" in ci and ci["synth"].get("mb_per_s"):
        print("synth: %.0f MB/s end to end (generate+hash %.0f MB/s)" % (
            ci["synth"]["mb_per_s"], ci["synth"]["generate_mb_per_s"]))
    for q in sorted(k for k in fio if isinstance(k, int)):
        print("fio randread bs=%d QD%-2d %-8s %7.0f MB/s (passes %s; %.2f ms/read)" % (
            blob, q, fio[q].get("engine"), fio[q].get("mb_per_s", 0),
            ", ".join("%.0f" % p.get("mb_per_s", 0) for p in fio[q]["passes"]),
            fio[q].get("clat_ms_mean", 0)))
    for t, p in sorted(ram.items()):
        print("ram probe %d thr: read %.1f GB/s, copy %.1f GB/s, triad %.1f GB/s" % (
            t, p["read_gbs"], p["copy_gbs"], p["triad_gbs"]))
    for j in res["read_probe"]:
        print("read_probe QD1 %-46s %7.0f MB/s (alloc %.2f + read %.2f + hash %.2f ms)" % (
            j["name"], j["mb_per_s"], j["alloc_ms"], j["read_ms"], j["hash_ms"]))
    print("%-60s %10s %10s  %-26s %6s %6s" % ("figure", "measured", "limit", "limit is", "ratio",
                                               "target"))
    for r_ in rows:
        print("%-60s %10s %10s  %-26s %6s %6s" % (
            r_["figure"][:60], fmt(r_["value"], "", 1), fmt(r_["limit"], "", 1),
            r_["limit_name"][:26], fmt(r_["ratio"], "", 2),
            ">=%.2f" % r_["target"] if r_["target"] else ""))
    for c in cold:
        print("cold %-28s rep %d: %s" % (c.get("conf"), c.get("rep", 0), {
            k: (round(v, 2) if isinstance(v, float) else v) for k, v in c.items()
            if k in ("decode_tok_s", "read_mb_s", "read_mb_s_wall", "miss_pct", "recall",
                     "precision", "stall_ms_tok", "misses_per_layer_step", "reads_per_layer_step",
                     "load_before", "error")}))
    for w in warm:
        print("warm %d thr %-6s %-8s: %s" % (w["threads"], w.get("quant_kernels", "?"),
                                            w["omp_wait_policy"], {
            k: (round(v, 3) if isinstance(v, float) else v) for k, v in w.items()
            if k in ("measured_seconds", "preload_seconds", "load_before", "error")} |
            {"stage_ms_per_token": {k: round(1e3 * v / max(1, w.get("tokens", {}).get("measured", 1)), 2)
                                    for k, v in w.get("measured_stage_seconds", {}).items()}}))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
        print("wrote %s" % a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
