"""netlab: several "hosts" on one Linux machine for cluster tests and
benchmarks (../shared/TESTING.md).

Each host is a network namespace joined to the root namespace by a veth
pair on its own /24 (root side 10.B.N.1, host side 10.B.N.2, where B is a
second octet no other address on this machine uses, so two labs can run at
once; read host.addr / host.gateway), optionally
with a tbf rate limit on both ends of the link. Hosts added with lan=True
share one L2 segment instead: their veths hang on a bridge in the root
namespace (10.B.250.1), each host at 10.B.250.(N+1), multicast on, so mDNS
between them works (read lab.lan_bridge). Processes started on a host
can be put in a cgroup v1 blkio group (read bandwidth limit on the root
disk) and a memory group. Everything is removed on close(), also when the
caller is interrupted (use it as a context manager; SIGTERM is turned into
KeyboardInterrupt while a Lab is open).

Needs root, `ip` (iproute2) and `tc`. `Lab.available()` says whether this
machine can run it and why not.
"""
import os
import signal
import subprocess
import time

CG = "/sys/fs/cgroup"


def _run(*argv, check=True):
    r = subprocess.run(argv, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError("%s: %s" % (" ".join(argv), r.stderr.strip()))
    return r


def root_disk():
    """MAJ:MIN of the block device holding '/' (the whole disk)."""
    st = os.stat("/")
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    # a partition's parent disk: /sys/dev/block/M:m/../dev
    link = os.path.realpath("/sys/dev/block/%d:%d" % (major, minor))
    parent = os.path.join(os.path.dirname(link), "dev")
    if os.path.exists(os.path.join(link, "partition")) and os.path.exists(parent):
        return open(parent).read().strip()
    return "%d:%d" % (major, minor)


class Host:
    def __init__(self, lab, index, name, lan=False):
        self.lab, self.index, self.name = lab, index, name
        self.ns = "%s-%s" % (lab.prefix, name)
        self.veth_root = "%sr%d" % (lab.short, index)
        self.veth_host = "%sh%d" % (lab.short, index)
        if lan:   # one segment: the bridge is every host's gateway
            self.addr = "10.%d.250.%d" % (lab.octet, index + 1)
            self.gateway = "10.%d.250.1" % lab.octet
        else:
            self.addr = "10.%d.%d.2" % (lab.octet, index)      # the host's address
            self.gateway = "10.%d.%d.1" % (lab.octet, index)   # the root side of this link

    def argv(self, argv):
        return ["ip", "netns", "exec", self.ns] + list(argv)

    def popen(self, argv, blkio_bps=None, memory_bytes=None, **kw):
        """Start argv in this host's namespace; with blkio_bps, limit its
        reads from the root disk to that many bytes/s (cgroup v1 blkio),
        with memory_bytes cap its memory. The process joins its cgroups
        before it execs, so the limits hold from its first read."""
        tag = "%s-%d" % (self.name, len(self.lab.procs))
        groups = []
        if blkio_bps:
            groups.append(self.lab.blkio_group(blkio_bps, tag))
        if memory_bytes:
            groups.append(self.lab.memory_group(memory_bytes, tag))
        argv = self.argv(argv)
        if groups:
            # join outside the namespace: `ip netns exec` remounts /sys
            join = "; ".join("echo $$ > %s/cgroup.procs" % g for g in groups)
            argv = ["/bin/sh", "-c", join + ' && exec "$@"', "sh"] + argv
        p = subprocess.Popen(argv, start_new_session=True, **kw)
        self.lab.procs.append(p)
        return p


class Lab:
    @staticmethod
    def available():
        """(True, "") or (False, why)."""
        if os.geteuid() != 0:
            return False, "needs root (network namespaces)"
        for tool in ("ip", "tc"):
            if subprocess.run(["which", tool], capture_output=True).returncode != 0:
                return False, "needs %s (iproute2)" % tool
        return True, ""

    def __init__(self, prefix=None):
        self.prefix = prefix or "shoal%d" % os.getpid()
        self.short = "s%x" % (os.getpid() % 0xfffff)
        self.hosts, self.procs, self.cgroups = [], [], []
        self.lan_bridge = None
        self._old_term = None
        self._old_forward = None
        self.octet = self._free_octet()

    @staticmethod
    def _free_octet():
        """A second octet B with no 10.B.x.x address on this machine."""
        r = _run("ip", "-4", "-o", "addr", check=False)
        used = r.stdout
        for k in range(128):
            b = 64 + (os.getpid() + k) % 128
            if " 10.%d." % b not in used:
                return b
        raise RuntimeError("no free 10.B.0.0/16 range for a lab")

    def __enter__(self):
        def on_term(signum, frame):
            raise KeyboardInterrupt("SIGTERM")
        self._old_term = signal.signal(signal.SIGTERM, on_term)
        return self

    def __exit__(self, *exc):
        self.close()
        if self._old_term is not None:
            signal.signal(signal.SIGTERM, self._old_term)
        return False

    def _lan(self):
        """The bridge of the lan=True hosts, made on first use."""
        if not self.lan_bridge:
            br = "%sbr" % self.short
            _run("ip", "link", "add", br, "type", "bridge")
            self.lan_bridge = br
            _run("ip", "addr", "add", "10.%d.250.1/24" % self.octet, "dev", br)
            _run("ip", "link", "set", "dev", br, "multicast", "on")
            _run("ip", "link", "set", br, "up")
        return self.lan_bridge

    def add_host(self, name, rate=None, burst="256kb", lan=False):
        """A namespace linked to the root namespace; rate like '1gbit'
        limits both directions with tbf, which lets `burst` bytes (tc's
        units) through at the veth's own speed before the rate holds: a
        small burst makes each message wait for the rate as a real link's
        serialization does. lan: on the shared bridge (module docstring).
        A host off the lan routes everything through the root namespace
        (route_between() lets such hosts reach each other); this kernel
        has no netem, so a round trip's delay comes from delayproxy.py."""
        h = Host(self, len(self.hosts) + 1, name, lan=lan)
        self.hosts.append(h)
        _run("ip", "netns", "add", h.ns)
        _run("ip", "link", "add", h.veth_root, "type", "veth", "peer", "name", h.veth_host)
        _run("ip", "link", "set", h.veth_host, "netns", h.ns)
        if lan:
            _run("ip", "link", "set", h.veth_root, "master", self._lan())
        else:
            _run("ip", "addr", "add", h.gateway + "/24", "dev", h.veth_root)
        _run("ip", "link", "set", "dev", h.veth_root, "multicast", "on")
        _run("ip", "link", "set", h.veth_root, "up")
        _run(*h.argv(["ip", "addr", "add", h.addr + "/24", "dev", h.veth_host]))
        _run(*h.argv(["ip", "link", "set", "dev", h.veth_host, "multicast", "on"]))
        _run(*h.argv(["ip", "link", "set", h.veth_host, "up"]))
        _run(*h.argv(["ip", "link", "set", "lo", "up"]))
        if not lan:
            _run(*h.argv(["ip", "route", "add", "default", "via", h.gateway]))
        if rate:
            _run("tc", "qdisc", "add", "dev", h.veth_root, "root", "tbf", "rate", rate,
                 "burst", burst, "latency", "50ms")
            _run(*h.argv(["tc", "qdisc", "add", "dev", h.veth_host, "root", "tbf", "rate",
                          rate, "burst", burst, "latency", "50ms"]))
        return h

    def route_between(self):
        """Let the hosts reach each other through the root namespace (IPv4
        forwarding on until close()): a host's link then carries all its
        traffic, as one machine's NIC on a switched LAN does."""
        path = "/proc/sys/net/ipv4/ip_forward"
        if self._old_forward is None:
            self._old_forward = open(path).read().strip()
        with open(path, "w") as f:
            f.write("1\n")

    def _cgroup(self, controller, name):
        path = os.path.join(CG, controller, "%s-%s" % (self.prefix, name))
        os.makedirs(path, exist_ok=True)
        self.cgroups.append(path)
        return path

    def blkio_group(self, bps, name):
        """A blkio cgroup limiting reads from the root disk to bps bytes/s."""
        path = self._cgroup("blkio", name)
        with open(os.path.join(path, "blkio.throttle.read_bps_device"), "w") as f:
            f.write("%s %d\n" % (root_disk(), int(bps)))
        return path

    def memory_group(self, nbytes, name):
        """A memory cgroup capped at nbytes."""
        path = self._cgroup("memory", name)
        with open(os.path.join(path, "memory.limit_in_bytes"), "w") as f:
            f.write(str(int(nbytes)))
        return path

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.procs = []
        for h in self.hosts:
            _run("ip", "netns", "del", h.ns, check=False)
            _run("ip", "link", "del", h.veth_root, check=False)
        self.hosts = []
        if self._old_forward is not None:
            with open("/proc/sys/net/ipv4/ip_forward", "w") as f:
                f.write(self._old_forward + "\n")
            self._old_forward = None
        if self.lan_bridge:
            _run("ip", "link", "del", self.lan_bridge, check=False)
            self.lan_bridge = None
        for path in reversed(self.cgroups):
            for _ in range(50):
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
        self.cgroups = []


def leftovers(prefix="shoal"):
    """Namespaces and cgroups named by a Lab that are still there (for tests
    that check cleanup)."""
    out = []
    r = _run("ip", "netns", "list", check=False)
    out += [l.split()[0] for l in r.stdout.splitlines() if l.startswith(prefix)]
    for c in ("blkio", "memory"):
        d = os.path.join(CG, c)
        if os.path.isdir(d):
            out += [os.path.join(d, n) for n in os.listdir(d) if n.startswith(prefix)]
    return out


if __name__ == "__main__":
    # self-check: two hosts, one throttled; ping each and measure the
    # throttled link with a socket pair
    ok, why = Lab.available()
    if not ok:
        print("netlab: skipped:", why)
        raise SystemExit(0)
    import socket
    import threading

    def throughput(host, n):
        """Send n bytes from host to a listener in the root namespace."""
        srv = socket.socket()
        srv.bind((host.gateway, 0))
        srv.listen(1)
        port = srv.getsockname()[1]
        got = []

        def sink():
            c, _ = srv.accept()
            t0, total = time.time(), 0
            while total < n:
                d = c.recv(1 << 16)
                if not d:
                    break
                total += len(d)
            got.append((total, time.time() - t0))
        th = threading.Thread(target=sink)
        th.start()
        code = ("import socket;s=socket.create_connection(('%s',%d));"
                "s.sendall(b'x'*%d);s.close()" % (host.gateway, port, n))
        host.popen(["/usr/bin/python3", "-c", code]).wait(timeout=60)
        th.join(timeout=60)
        srv.close()
        total, secs = got[0]
        return total, total * 8 / secs / 1e6

    with Lab() as lab:
        a = lab.add_host("a")
        b = lab.add_host("b", rate="80mbit")
        total, fast = throughput(a, 64 << 20)
        print("netlab: host a (no limit): %d bytes at %.0f Mbit/s" % (total, fast))
        total, slow = throughput(b, 8 << 20)
        print("netlab: host b (tbf 80mbit): %d bytes at %.1f Mbit/s" % (total, slow))
        assert 40 < slow < 100 and fast > 4 * slow, (fast, slow)
        prefix = lab.prefix
    assert not leftovers(prefix), leftovers(prefix)
    print("netlab: ok, cleaned up")
