"""Shared pieces of the benchmark scripts (bench/store_bench.py, bench/sweep,
bench/compare); protocol in docs/BENCHMARKS.md.

  running things      log, sh, loadavg, drop_caches
  the machine         machine_info (CPU, RAM, file system, device, commit)
  the container       container_info (shapes, blob size, expert bytes)
  the SSD limit       fio_randread (random O_DIRECT reads of one blob each)
  the RAM limit       build_ram_probe / ram_probe (bench/ram_probe.c)
  numbers             fmt, ratio, med, fio_at, parse_size, fmt_size
  sweeps              parse_grid, grid_configs, bench_flags, config_name,
                      flatten (a `shoal bench` JSON to one CSV row)
  clusters            Cleanup (undo everything on exit, SIGINT, SIGTERM),
                      LoopbackWorkers / NetnsWorkers (start shoal-worker
                      processes, on 127.0.0.1 or each in a network namespace
                      with a tbf-throttled veth link and a blkio-throttled disk)

Only the standard library; /usr/bin/python3 (Debian) is the interpreter the
project documents (../shared/TESTING.md).
"""
import base64
import itertools
import json
import math
import os
import platform
import re
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def sh(cmd, timeout=3600, env=None, check=False):
    e = dict(os.environ)
    if env:
        e.update(env)
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e)
    r.wall = time.time() - t0
    if check and r.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(cmd), r.returncode,
                                                   (r.stderr or r.stdout)[-2000:]))
    return r


def loadavg():
    try:
        return [float(x) for x in open("/proc/loadavg").read().split()[:3]]
    except OSError:
        return None


def drop_caches():
    """sync; echo 3 > /proc/sys/vm/drop_caches (root). Returns True if done."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError as e:
        log("warning: cannot drop the page cache (%s); cold runs rely on O_DIRECT only" % e)
        return False


# ---- machine -------------------------------------------------------------------


def machine_info(path):
    info = {"python": sys.version.split()[0], "kernel": platform.release()}
    cpu = None
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info["cpu"] = cpu or platform.processor()
    info["cores"] = os.cpu_count()
    try:
        flags = open("/proc/cpuinfo").read()
        info["avx2"] = " avx2" in flags
        info["avx512f"] = " avx512f" in flags
    except OSError:
        pass
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                info["ram_gib"] = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    r = sh(["findmnt", "-n", "-o", "SOURCE,FSTYPE", "--target", path])
    if r.returncode == 0 and r.stdout.split():
        src, fstype = r.stdout.split()[:2]
        info["fs"] = fstype
        info["device"] = src
        dev = os.path.basename(src)
        r2 = sh(["lsblk", "-ndo", "SIZE,ROTA,MODEL", "/dev/" + dev])
        f = r2.stdout.split() if r2.returncode == 0 else []
        drv = os.path.basename(os.path.realpath("/sys/block/%s/device/driver" % dev)) \
            if os.path.exists("/sys/block/%s/device/driver" % dev) else "?"
        info["disk"] = "%s %s, rotational=%s, driver %s" % (
            dev, f[0] if f else "?", f[1] if len(f) > 1 else "?", drv) + \
            (" (%s)" % " ".join(f[2:]) if len(f) > 2 else "")
        try:
            info["scheduler"] = open("/sys/block/%s/queue/scheduler" % dev).read().strip()
        except OSError:
            pass
    r = sh(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"])
    info["commit"] = r.stdout.strip() if r.returncode == 0 else "?"
    r = sh(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no", "--",
            "common", "coordinator", "meson.build"])
    info["dirty"] = bool(r.stdout.strip()) if r.returncode == 0 else None
    return info


# ---- the container ----------------------------------------------------------------


def container_info(model):
    man = json.load(open(os.path.join(model, "shoal.json")))
    cfg = man["config"]
    ex = man["experts"]
    n_moe = len(ex["layers"])
    info = {
        "dir": model,
        "model_type": man["model_type"],
        "fingerprint": man["fingerprint"],
        "experts_file": os.path.join(model, ex["file"]),
        "experts_file_bytes": ex["bytes"],
        "blob_bytes": ex["blob_bytes"],
        "experts_dtype": ex["dtype"],
        "n_moe_layers": n_moe,
        "n_expert": ex["n_expert"],
        "top_k": cfg["num_experts_per_tok"],
        "hidden": cfg["hidden_size"],
        "vocab": cfg["vocab_size"],
        "dense_bytes": man["dense"]["bytes"],
    }
    info["expert_bytes"] = n_moe * info["n_expert"] * info["blob_bytes"]
    sp = os.path.join(model, "synth.json")
    if os.path.exists(sp):
        s = json.load(open(sp))
        info["synth"] = {k: s.get(k) for k in ("command", "trace", "domain", "seed", "drift",
                                               "generate_seconds", "write_seconds",
                                               "total_seconds", "bytes")}
        if s.get("total_seconds"):
            info["synth"]["mb_per_s"] = s["bytes"] / 1e6 / s["total_seconds"]
            info["synth"]["generate_mb_per_s"] = s["bytes"] / 1e6 / max(s["generate_seconds"], 1e-9)
    return info


# ---- (a) fio ---------------------------------------------------------------------


def fio_randread(path, bs, file_bytes, qd, runtime, engine):
    size = (file_bytes - 4096) // bs * bs
    cmd = ["fio", "--name=blobs", "--filename=" + path, "--readonly", "--rw=randread",
           "--direct=1", "--ioengine=" + engine, "--bs=%d" % bs, "--iodepth=%d" % qd,
           "--offset=4096", "--size=%d" % size, "--time_based", "--runtime=%d" % runtime,
           "--ramp_time=1", "--randrepeat=0", "--norandommap", "--output-format=json"]
    r = sh(cmd, timeout=runtime + 120)
    if r.returncode != 0:
        return {"error": (r.stderr or r.stdout).strip()[-500:], "cmd": " ".join(cmd)}
    j = json.loads(r.stdout[r.stdout.index("{"):])
    rd = j["jobs"][0]["read"]
    lat = rd.get("clat_ns") or rd.get("lat_ns") or {}
    return {"qd": qd, "engine": engine, "bs": bs, "mb_per_s": rd["bw_bytes"] / 1e6,
            "iops": rd["iops"], "clat_ms_mean": lat.get("mean", 0) / 1e6,
            "cmd": " ".join(cmd)}


def build_ram_probe(workdir):
    out = os.path.join(workdir, "ram_probe")
    base = os.path.join(HERE, "..", "common", "base")
    src = [os.path.join(HERE, "ram_probe.c"), os.path.join(base, "memread.c"),
           os.path.join(base, "pages.c")]
    cc = os.environ.get("CC", "cc")
    r = sh([cc, "-O3", "-march=native", "-fopenmp", "-I" + base] + src + ["-o", out])
    if r.returncode != 0:
        r = sh([cc, "-O3", "-fopenmp", "-I" + base] + src + ["-o", out], check=True)
    return out


def ram_probe(exe, threads, mb=512, reps=10):
    r = sh([exe, "--mb", str(mb), "--reps", str(reps), "--threads", str(threads)],
           env={"OMP_WAIT_POLICY": "passive"}, check=True)
    return json.loads(r.stdout)


def fmt(x, unit="", nd=0):
    if x is None:
        return "n/a"
    return ("%." + str(nd) + "f%s") % (x, unit)


def ratio(a, b):
    return a / b if a is not None and b else None


def fio_at(fio, qd):
    """fio MB/s at queue depth qd, interpolated (linearly in log2 QD) between the
    depths measured; None when nothing was measured."""
    pts = sorted((k, v["mb_per_s"]) for k, v in fio.items()
                 if isinstance(k, int) and "mb_per_s" in v)
    if not pts or qd is None:
        return None
    if qd <= pts[0][0]:
        return pts[0][1]
    for (q0, b0), (q1, b1) in zip(pts, pts[1:]):
        if q0 <= qd <= q1:
            f = (math.log2(qd) - math.log2(q0)) / (math.log2(q1) - math.log2(q0))
            return b0 + f * (b1 - b0)
    return pts[-1][1]


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# ---- sizes ------------------------------------------------------------------------

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text):
    """'256M', '1G', '1.5G', '4096', 'unlimited' -> bytes (int; None for
    unlimited), as `shoal --expert-cache` reads them (K/M/G/T are powers of
    1024). Raises ValueError naming the text."""
    t = str(text).strip()
    if t == "unlimited":
        return None
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([KMGTkmgt]?)(i?B)?", t)
    if not m:
        raise ValueError("'%s' is not a size (e.g. 256M, 1G, unlimited)" % text)
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def fmt_size(n):
    """bytes -> the shortest exact '256M' / '1G' / '1.5G' style text."""
    if n is None:
        return "unlimited"
    for u in ("T", "G", "M", "K"):
        v = n / _UNITS[u]
        if v >= 1 and abs(v * 10 - round(v * 10)) < 1e-9:
            return ("%g" % v) + u
    return str(n)


# ---- sweep grids -----------------------------------------------------------------------

# grid key -> `shoal bench` flag; any other key k becomes --k (underscores as dashes)
KEY_FLAGS = {
    "cache": "--expert-cache", "expert_cache": "--expert-cache", "pin": "--pin",
    "prefetch": "--prefetch", "io": "--io", "direct": "--direct",
    "qd": "--queue-depth", "queue_depth": "--queue-depth", "threads": "--threads",
    "local": "--local-experts", "local_experts": "--local-experts", "gen": "--gen",
    "state": "--state", "prompt_len": "--prompt-len", "ctx": "--ctx",
}
# keys the sweep handles itself (not a flag of `shoal bench`)
SWEEP_KEYS = {"workers"}
# keys whose values are sizes (sorted and plotted by bytes)
SIZE_KEYS = {"cache", "expert_cache", "pin"}


def parse_grid(items):
    """Grid items 'key=v1,v2,...' (command line) or lines of a grid file
    ('key=v1,v2' or 'key: v1, v2'; '#' comments; several items per line
    allowed) -> ordered list of (key, [values]). Raises ValueError on a
    malformed item or a repeated key."""
    grid, seen = [], set()
    for item in items:
        for part in re.split(r"\s+(?=[A-Za-z_][A-Za-z0-9_-]*\s*[=:])", item.split("#", 1)[0].strip()):
            if not part:
                continue
            m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_-]*)\s*[=:]\s*(.+)", part)
            if not m:
                raise ValueError("grid item '%s' is not key=v1,v2,..." % part)
            key = m.group(1).replace("-", "_")
            vals = [v.strip() for v in re.split(r"[,\s]+", m.group(2).strip()) if v.strip()]
            if not vals:
                raise ValueError("grid key '%s' has no values" % key)
            if key in seen:
                raise ValueError("grid key '%s' given twice" % key)
            if key in SIZE_KEYS:
                for v in vals:
                    parse_size(v)
            if key == "workers" and not all(v.isdigit() for v in vals):
                raise ValueError("workers= takes worker counts (0, 1, 2, ...), got %s" % vals)
            seen.add(key)
            grid.append((key, vals))
    return grid


def read_grid_file(path):
    with open(path) as f:
        return parse_grid([line for line in f])


def grid_configs(grid):
    """Cartesian product of the grid, in grid order: [ {key: value} ]."""
    keys = [k for k, _ in grid]
    return [dict(zip(keys, combo)) for combo in itertools.product(*[v for _, v in grid])]


def config_name(conf):
    """'cache=256M prefetch=on io=uring' (stable, grid order)."""
    return " ".join("%s=%s" % kv for kv in conf.items())


def bench_flags(conf):
    """The `shoal bench` flags of one configuration (without workers)."""
    out = []
    for k, v in conf.items():
        if k in SWEEP_KEYS:
            continue
        out += [KEY_FLAGS.get(k, "--" + k.replace("_", "-")), v]
    return out


def sort_value(key, v):
    """A sortable, plottable number for a grid value (sizes in bytes,
    unlimited last; on/off as 1/0; numbers as numbers; else None)."""
    if key in SIZE_KEYS:
        b = parse_size(v)
        return float("inf") if b is None else float(b)
    if v in ("on", "off"):
        return 1.0 if v == "on" else 0.0
    try:
        return float(v)
    except ValueError:
        return None


# ---- one `shoal bench` JSON as a flat row -------------------------------------------

# the figures every row carries (median over the run's --reps), in CSV order
FIGURES = ["ttft_ms", "prefill_tok_s", "decode_tok_s", "ms_per_token", "ms_attention",
           "ms_routing", "ms_expert_wait", "ms_expert_compute", "ms_network", "ms_combine",
           "ms_head", "ms_other", "hit_rate", "hit_pinned", "hit_cache", "hit_inflight",
           "miss_disk", "expert_read_mb", "expert_read_mb_s", "expert_compute_mb_s",
           "prefetch_precision", "prefetch_recall", "worker_hit_rate", "worker_read_mb_s",
           "hit_rate_all", "wire_mb", "wire_mb_s", "peak_rss_mb"]
# the stages of the time-per-token breakdown (they sum to ms_per_token)
STAGES = ["ms_attention", "ms_routing", "ms_expert_wait", "ms_expert_compute", "ms_network",
          "ms_combine", "ms_head", "ms_other"]


def _num(x):
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def flatten(res):
    """Figures (medians and spreads), limits and ratios of a `shoal bench`
    JSON, as one flat dict of numbers / strings (None when absent)."""
    row = {}
    summ = res.get("summary") or {}
    for k in FIGURES:
        s = summ.get(k) or {}
        row[k] = _num(s.get("median"))
        row[k + "_spread"] = _num(s.get("spread"))
    lim = res.get("limits") or {}
    row["limit_ssd_mb_s"] = _num((lim.get("ssd") or {}).get("mb_per_s"))
    row["limit_ram_read_mb_s"] = _num(1e3 * ((lim.get("ram") or {}).get("read_gbs") or float("nan")))
    row["limit_ram_triad_mb_s"] = _num(1e3 * ((lim.get("ram") or {}).get("triad_gbs") or float("nan")))
    net = lim.get("net") or {}
    row["limit_link_mb_s"] = _num(net.get("mb_per_s"))
    row["limit_rtt_ms"] = _num(net.get("rtt_ms"))
    rat = res.get("ratios") or {}
    for k in ("expert_read_vs_ssd", "expert_compute_vs_ram", "wire_vs_link"):
        row["run_ratio_" + k] = _num((rat.get(k) or {}).get("ratio"))
    w = rat.get("wire_vs_link") or {}
    row["busiest_link_mb_s"] = _num(w.get("limit"))
    row["busiest_link_wire_mb_s"] = _num(w.get("figure"))
    # every executor's acquires when workers ran, else the local store's
    row["hit_rate_total"] = row["hit_rate_all"] if row["hit_rate_all"] is not None \
        else row["hit_rate"]
    row["generated_ids_xxh64"] = res.get("generated_ids_xxh64")
    row["commit"] = res.get("commit")
    row["reps_ok"] = sum(1 for r in res.get("runs", []) if "error" not in r)
    return row


# ---- cleaning up after ourselves -------------------------------------------------------


class Cleanup:
    """A stack of undo actions run once, in reverse order, at exit, on
    SIGINT/SIGTERM/SIGHUP (which then exit with 128 + signal), or when
    run() is called. Each action's failure is reported and the rest still
    run."""

    def __init__(self):
        self.actions = []
        self.done = False
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, self._on_signal)
        import atexit
        atexit.register(self.run)

    def push(self, what, fn):
        self.actions.append((what, fn))

    def pop_run(self, n=None):
        """Run (and forget) the last n actions (all by default)."""
        n = len(self.actions) if n is None else n
        for _ in range(n):
            what, fn = self.actions.pop()
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - report and keep cleaning
                log("cleanup: %s failed: %s" % (what, e))

    def run(self):
        self.pop_run()

    def _on_signal(self, signum, frame):
        log("signal %d: cleaning up (%d actions)" % (signum, len(self.actions)))
        self.run()
        os._exit(128 + signum)


def run_logged(cmd, logfile, cleanup, env=None, timeout=None):
    """Run cmd with stdout and stderr appended to the open file logfile;
    while it runs, stopping it is on the cleanup stack (a SIGTERM to the
    script reaches it too). Returns its exit status (124 after timeout)."""
    p = subprocess.Popen(cmd, stdout=logfile, stderr=subprocess.STDOUT, env=env)
    cleanup.push("stop %s" % os.path.basename(cmd[0]), lambda: _stop(p))
    try:
        rc = p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(p)
        logfile.write("\n# killed after %s s\n" % timeout)
        rc = 124
    cleanup.actions.pop()
    return rc


def write_cluster_key(workdir):
    """A fresh 32-byte cluster key in WORKDIR/cluster.key (mode 0600), made
    with workdir if missing; returns its path."""
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "cluster.key")
    with open(path, "w") as f:
        f.write(base64.b64encode(secrets.token_bytes(32)).decode() + "\n")
    os.chmod(path, 0o600)
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc, grace=5.0):
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace)


def _wait_ready(proc, logpath, timeout):
    """Wait until the worker logged 'serving' (its store and compute probe
    are done); returns the address it logged after 'listening on'."""
    t0 = time.time()
    addr = None
    while time.time() - t0 < timeout:
        text = open(logpath, errors="replace").read() if os.path.exists(logpath) else ""
        m = re.search(r"listening on (\S+)", text)
        if m:
            addr = m.group(1)
        if addr and re.search(r"\bserving\b", text):
            return addr
        if proc.poll() is not None:
            raise RuntimeError("shoal-worker exited with status %d before serving; its log "
                               "%s ends: %s" % (proc.returncode, logpath, text.strip()[-400:]))
        time.sleep(0.05)
    raise RuntimeError("shoal-worker did not serve within %.0f s (log %s)" % (timeout, logpath))


class LoopbackWorkers:
    """n shoal-worker processes on 127.0.0.1 (ports chosen by the kernel, or
    port_base + i for the i-th), each with the full container. Use as a
    context manager; stop() is also pushed on the Cleanup stack, so an
    interrupt stops them too."""

    def __init__(self, worker, model, n, logdir, cleanup, flags=(), env=None, tag="w",
                 port_base=None):
        self.procs, self.addrs = [], []
        self.extra = []   # `shoal bench` flags the cluster needs
        os.makedirs(logdir, exist_ok=True)
        cleanup.push("stop %d workers" % n, self.stop)
        self.cleanup = cleanup
        try:
            for i in range(n):
                lp = os.path.join(logdir, "%s%d.log" % (tag, i))
                cmd = [worker, "--model", model, "--listen", "127.0.0.1:%d" % (
                    port_base + i if port_base else 0)] + list(flags)
                with open(lp, "w") as lf:
                    lf.write("# %s\n" % " ".join(cmd))
                    lf.flush()
                    p = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True)
                self.procs.append(p)
                self.addrs.append(_wait_ready(p, lp, 120))
        except BaseException:
            self.stop()
            raise

    def stop(self):
        for p in self.procs:
            _stop(p)
        self.procs = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        # forget our entry on the cleanup stack (it is the last one pushed)
        if self.cleanup.actions and self.cleanup.actions[-1][1] == self.stop:
            self.cleanup.actions.pop()


class NetnsWorkers(LoopbackWorkers):
    """n shoal-workers, each in its own network namespace joined to the
    host by a veth pair (tests/cluster/netlab.py: host 10.B.I.1, worker
    10.B.I.2, B a free second octet), optionally with a tbf rate limit on both ends of each link
    (`--link-rate 1gbit`) and a cgroup-v1 blkio read throttle on the disk
    (`--disk-bps N`), as in ../shared/TESTING.md. Each listens on port
    7070 of its own address, or port_base + i for the i-th. Needs root. A
    non-loopback listener needs a cluster key: one is written to keyfile and passed to
    both sides. Everything is undone by stop(), at exit and on signals."""

    def __init__(self, worker, model, n, logdir, cleanup, flags=(), env=None, rate=None,
                 disk_bps=None, keyfile=None, tag="w", port_base=None):
        sys.path.insert(0, os.path.join(ROOT, "tests", "cluster"))
        import netlab
        ok, why = netlab.Lab.available()
        if not ok:
            raise RuntimeError("--netns: %s" % why)
        self.procs, self.addrs = [], []
        self.cleanup = cleanup
        self.lab = netlab.Lab(prefix="shoalsw%d" % os.getpid())
        cleanup.push("tear down %d namespaced workers" % n, self.stop)
        os.makedirs(logdir, exist_ok=True)
        if not os.path.exists(keyfile):
            with open(keyfile, "w") as f:
                f.write(base64.b64encode(secrets.token_bytes(32)).decode() + "\n")
            os.chmod(keyfile, 0o600)
        self.extra = ["--cluster-key", keyfile]
        try:
            for i in range(n):
                h = self.lab.add_host("%s%d" % (tag.replace("-", ""), i), rate=rate)
                addr = "%s:%d" % (h.addr, port_base + i if port_base else 7070)
                lp = os.path.join(logdir, "%s%d.log" % (tag, i))
                cmd = [worker, "--model", model, "--listen", addr, "--cluster-key",
                       keyfile] + list(flags)
                with open(lp, "w") as lf:
                    lf.write("# %s (namespace %s%s%s)\n" % (
                        " ".join(cmd), h.ns, ", link %s" % rate if rate else "",
                        ", disk %d B/s" % disk_bps if disk_bps else ""))
                    lf.flush()
                    p = h.popen(cmd, blkio_bps=disk_bps, stdout=lf, stderr=subprocess.STDOUT,
                                env=env)
                self.procs.append(p)
                _wait_ready(p, lp, 120)
                self.addrs.append(addr)
        except BaseException:
            self.stop()
            raise

    def stop(self):
        LoopbackWorkers.stop(self)
        self.lab.close()
