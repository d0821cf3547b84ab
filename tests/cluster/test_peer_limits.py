#!/usr/bin/env python3
"""What a peer can cost (issue 12, "Peer input"; docs/PROTOCOL.md "Limits").

Real processes over loopback; memory is read from /proc (VmRSS, and VmHWM
after resetting it through /proc/PID/clear_refs, so a transient peak
counts). Against a shoal-worker and a coordinator (`shoal chat` with
--accept-workers and --control, on both ports):

1. unauthenticated connections that announce a large frame and send most
   of it: each costs at most 64 KiB (the frame is refused at its length
   prefix, beyond the 16 KiB handshake limit), and the process keeps
   serving;
2. frames made of repeated unknown protobuf fields (`78 00 ...`), before
   the handshake (raw) and after it (wire_probe unknown-fields): refused
   with an error reply, the peak RSS stays within a few times the frame;
3. at most 16 unauthenticated connections are held at once: 100 silent
   connections leave at most 16 open, and a real peer is served after;
4. a connection that closes with queued requests: the worker drops them
   (wire_probe cancel-on-close counts the expert acquires after the close);
5. after a keyless handshake as a coordinator: pipelined requests whose
   replies are 8x their size, never read, cost the worker a bounded peak
   (reply bytes count against the backpressure budget) and RSS returns
   near its idle size once the connection is gone; a reply over the frame
   limit is refused at validation;
6. authenticated coordinators per worker are capped (--max-coordinators):
   the one over the cap gets an ErrorReply naming it instead of Ready, and
   those under it holding 60 MiB partial frames cost at most their frames;
7. workers joining a coordinator cannot make it buffer large frames it did
   not ask for (60 MiB partial frames are refused at the length prefix);
8. silent connections from five addresses, re-dialled as fast as they are
   closed (slowloris), do not lock out a real handshake from a sixth, on a
   worker and on the control port;
9. the coordinator answers a malformed pre-authentication frame, and a
   worker dialling its control port, with an ErrorReply (never Ready);
10. SIGTERM: sent before the worker says it serves, and repeatedly during
   its drain and shutdown, the worker exits 0 every time, never killed by
   the signal.
11. the handshake caps are flags (--max-unauthenticated and
   --max-unauthenticated-per-address, defaults 16 and 4) on the worker and
   the coordinator: silent connections from one address, then from five,
   leave exactly the per-address share, then the whole cap, open (defaults
   and other values); a bad value is a one-line usage error, exit 2.

Usage: /usr/bin/python3 tests/cluster/test_peer_limits.py --shoal BIN --worker BIN --probe BIN
"""
import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import clusterlib as L  # noqa: E402
import wirelite as WL  # noqa: E402

R = L.Results()
UNAUTH_BYTES = 64 << 10      # documented per-connection bound (PROTOCOL.md)
UNAUTH_CONNS = 16            # documented cap on unauthenticated connections


def env():
    e = L.env()
    asan = e.get("ASAN_OPTIONS", "")
    # freed memory must go back, not wait in ASan's quarantine
    e["ASAN_OPTIONS"] = (asan + ":" if asan else "") + \
        "quarantine_size_mb=0:thread_local_quarantine_size_kb=0:abort_on_error=1"
    return e


def popen(cmd, **kw):
    """subprocess.Popen with env(): freed memory leaves ASan's quarantine."""
    kw["env"] = env()
    return subprocess.Popen(cmd, **kw)


def status_kb(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return -1


def reset_peak(pid):
    """Reset VmHWM to the current RSS (Linux 4.0+); False when not allowed."""
    try:
        with open("/proc/%d/clear_refs" % pid, "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def connect(addr):
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    return s


def send_quietly(s, data):
    """Send what the peer takes; it may close the connection meanwhile."""
    try:
        s.settimeout(5)
        s.sendall(data)
        return True
    except OSError:
        return False


def is_open(s):
    s.setblocking(False)
    try:
        return s.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def hold_partial_frames(name, pid, addr, n=20, announce=1 << 20):
    """n connections, each a length prefix of `announce` bytes and all but
    one byte of the body, held open: RSS may grow by n x 64 KiB at most."""
    time.sleep(0.3)
    rss0 = status_kb(pid, "VmRSS")
    socks = []
    body = b"\x3a" + b"\x00" * (announce - 2)
    for _ in range(n):
        s = connect(addr)
        send_quietly(s, announce.to_bytes(4, "little") + body)
        socks.append(s)
    time.sleep(1.0)
    rss1 = status_kb(pid, "VmRSS")
    for s in socks:
        s.close()
    bound = n * UNAUTH_BYTES // 1024 + 1024
    R("%s: %d unauthenticated connections announcing %d KiB frames cost %d KiB at most"
      % (name, n, announce >> 10, bound), rss1 - rss0 <= bound,
      "RSS %d kB -> %d kB (+%d kB)" % (rss0, rss1, rss1 - rss0))


def unknown_fields_raw(name, pid, addr, mb=4):
    """Before any handshake: one frame of `78 00` x (mb MiB / 2)."""
    time.sleep(0.3)
    if not reset_peak(pid):
        R.skip("%s: peak RSS of an unknown-field frame" % name, "cannot reset VmHWM")
        return
    rss0 = status_kb(pid, "VmRSS")
    n = mb << 20
    s = connect(addr)
    send_quietly(s, n.to_bytes(4, "little") + b"\x78\x00" * (n // 2))
    s.settimeout(20)
    try:
        reply = s.recv(4096)
    except OSError:
        reply = b""
    s.close()
    time.sleep(0.5)
    hwm = status_kb(pid, "VmHWM")
    bound = 3 * (n >> 10) + 2048
    R("%s: a %d MiB frame of unknown fields before the handshake: peak RSS +%d kB at most"
      % (name, mb, bound), hwm - rss0 <= bound,
      "RSS %d kB, peak %d kB (+%d kB); reply %r" % (rss0, hwm, hwm - rss0, reply[:80]))


def unknown_fields_authenticated(a, name, pid, addr, role, mb=8):
    """After the handshake (wire_probe): the same attack at the top level
    and inside a heartbeat; an error reply each, peak RSS bounded."""
    time.sleep(0.3)
    if not reset_peak(pid):
        R.skip("%s: peak RSS after the handshake" % name, "cannot reset VmHWM")
        return
    rss0 = status_kb(pid, "VmRSS")
    r = subprocess.run([a.probe, "--addr", addr, "--model", a.ct, "--role", role,
                        "unknown-fields", str(mb)], capture_output=True, text=True,
                       timeout=300, env=env())
    out = r.stdout + r.stderr
    time.sleep(0.5)
    hwm = status_kb(pid, "VmHWM")
    R("%s: unknown-field frames after the handshake get error replies" % name,
      r.returncode == 0 and out.count("ok unknown fields") == 2, out.strip()[-600:])
    # the reader holds the frame (1x), the unpack budget is 4x + 64 KiB
    bound = 6 * (mb << 10) + 4096
    R("%s: a %d MiB frame of unknown fields after the handshake: peak RSS +%d kB at most"
      % (name, mb, bound), hwm - rss0 <= bound,
      "RSS %d kB, peak %d kB (+%d kB)" % (rss0, hwm, hwm - rss0))


def connection_cap(name, addr, n=100):
    """n silent connections: at most UNAUTH_CONNS stay open."""
    socks = [connect(addr) for _ in range(n)]
    time.sleep(1.0)
    still = sum(is_open(s) for s in socks)
    for s in socks:
        s.close()
    R("%s: %d silent connections, at most %d held open" % (name, n, UNAUTH_CONNS),
      still <= UNAUTH_CONNS, "%d open" % still)


def probe_ok(a, addr, name, scenario, *extra, role=None, timeout=300):
    cmd = [a.probe, "--addr", addr, "--model", a.ct]
    if role:
        cmd += ["--role", role]
    r = subprocess.run(cmd + [scenario] + [str(x) for x in extra], capture_output=True,
                       text=True, timeout=timeout, env=env())
    out = r.stdout + r.stderr
    lines = [l for l in out.strip().splitlines() if l]
    ok = r.returncode == 0 and "FAIL" not in out
    R(name, ok, lines[-1] if ok and lines else "rc=%d\n%s" % (r.returncode, out[-1500:]))
    return ok


def inspect(a):
    """fingerprint, n_layer, n_expert, n_embd of the converted container."""
    r = subprocess.run([a.shoal, "inspect", a.ct], capture_output=True, text=True,
                       timeout=120, env=env())
    t = r.stdout
    fp = re.search(r"fingerprint\s+([0-9a-f]{16})", t)
    fam = re.search(r"(\d+) layers .*n_embd (\d+)", t)
    ex = re.search(r"experts\s+(\d+) per layer", t)
    if not (fp and fam and ex):
        return None
    return fp.group(1), int(fam.group(1)), int(ex.group(1)), int(fam.group(2))


def coord_info(a):
    return WL.peerinfo(fp=a.model_info[0])


def amplified_requests(a, name, pid, addr, n_req=40, rows=4000):
    """One coordinator pipelines requests naming every expert for every row
    and never reads: the reply bytes count against the budget, so the worker
    stops reading after a request or two instead of computing them all."""
    fp, nl, ne, embd = a.model_info
    time.sleep(0.3)
    if not reset_peak(pid):
        R.skip("%s: amplified replies" % name, "cannot reset VmHWM")
        return
    rss0 = status_kb(pid, "VmRSS")
    s = WL.connect(addr)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    why = WL.handshake(s, WL.ROLE_COORD, coord_info(a))
    if not R("%s: keyless handshake as a coordinator" % name, why is None, str(why)):
        s.close()
        return
    req = WL.frame(WL.expert_request(1, 0, rows, embd, range(ne)))
    s.settimeout(3)
    sent = 0
    for _ in range(n_req):
        try:
            s.sendall(req)
            sent += 1
        except OSError:
            break
    time.sleep(4.0)
    hwm = status_kb(pid, "VmHWM")
    s.close()
    # budget (64 MiB) + one request and its reply + the reader's partial frame
    bound = 4 * (64 << 10)
    R("%s: %d requests of %d KiB with replies of %d KiB, never read: peak RSS +%d kB at most"
      % (name, n_req, len(req) >> 10, (ne * rows * embd * 4) >> 10, bound),
      hwm - rss0 <= bound, "RSS %d kB, peak %d kB (+%d kB); %d requests sent before the "
      "worker stopped reading" % (rss0, hwm, hwm - rss0, sent))
    # the connection gone and the queue idle: the burst's memory goes back
    after = -1
    # a watchdog, not a speed: the running request finishes first (under
    # ASan beside busy loops that took over 10 s)
    for _ in range(600):
        time.sleep(0.2)
        after = status_kb(pid, "VmRSS")
        if after - rss0 <= 16384:
            break
    R("%s: after the connection closes RSS returns within 16 MiB of before" % name,
      after - rss0 <= 16384, "RSS %d kB before, %d kB after" % (rss0, after))
    # a reply over the frame limit: refused with an ErrorReply, not computed
    s = WL.connect(addr)
    why = WL.handshake(s, WL.ROLE_COORD, coord_info(a))
    big_rows = (64 << 20) // (embd * 4) // ne + 16
    msg = ""
    if why is None:
        s.settimeout(60)
        try:
            s.sendall(WL.frame(WL.expert_request(7, 0, big_rows, embd, range(ne))))
            msg = WL.error_message(WL.recv_frame(s))
        except (OSError, EOFError) as e:
            msg = "no reply: %s" % e
    s.close()
    R("%s: a request whose reply would pass the frame limit gets an ErrorReply" % name,
      "frame limit" in msg, msg or str(why))


def coordinator_cap(a, tmp, cap=2, n=4, mb=60):
    """A worker with --max-coordinators cap: the coordinators over it get an
    ErrorReply naming the cap instead of Ready; those under it each hold a
    partial frame of mb MiB."""
    w = L.Worker(a.worker, tmp, "capped", a.ct, "--max-coordinators", str(cap), launch=popen)
    socks = []
    try:
        if not R("worker with --max-coordinators %d starts" % cap, w.wait_ready(), w.text()[-500:]):
            return
        pid = w.p.pid
        time.sleep(0.3)
        rss0 = status_kb(pid, "VmRSS")
        refusals = []
        for i in range(n):
            s = WL.connect(w.addr)
            why = WL.handshake(s, WL.ROLE_COORD, coord_info(a))
            if why is not None:
                refusals.append(why)
                s.close()
                continue
            send_quietly(s, WL.partial_request(64 << 20, mb << 20))
            socks.append(s)
        time.sleep(1.0)
        rss1 = status_kb(pid, "VmRSS")
        R("worker: coordinators over --max-coordinators %d get an ErrorReply naming it" % cap,
          len(refusals) == n - cap and all("--max-coordinators %d" % cap in m for m in refusals),
          "%d refused: %r" % (len(refusals), refusals[:2]))
        bound = cap * (64 << 10) + 8192
        R("worker: %d coordinators holding %d MiB partial frames cost %d kB at most"
          % (n, mb, bound), rss1 - rss0 <= bound,
          "RSS %d kB -> %d kB (+%d kB)" % (rss0, rss1, rss1 - rss0))
        for s in socks:
            s.close()
        socks = []
        probe_ok(a, w.addr, "worker: serves a coordinator after the others left", "valid")
    finally:
        for s in socks:
            s.close()
        w.stop()


def rogue_workers(a, name, pid, addr, n=10, mb=60):
    """n workers join (keyless) and each sends mb MiB of a 64 MiB frame the
    coordinator never asked for: refused at the length prefix."""
    fp, nl, ne, embd = a.model_info
    time.sleep(0.3)
    rss0 = status_kb(pid, "VmRSS")
    socks, joined = [], 0
    for i in range(n):
        s = WL.connect(addr)
        info = WL.peerinfo(fp=fp, n_layer=nl, n_expert=ne, n_embd=embd,
                           coverage=b"\0" * ((nl * ne + 7) // 8), model_type="qwen3_moe",
                           name="rogue%d" % i)
        try:
            why = WL.handshake(s, WL.ROLE_WORKER, info)
        except (OSError, EOFError) as e:
            why = str(e)
        if why is None:
            joined += 1
            send_quietly(s, WL.partial_request(64 << 20, mb << 20))
        socks.append(s)
    time.sleep(1.0)
    rss1 = status_kb(pid, "VmRSS")
    for s in socks:
        s.close()
    R("%s: %d workers joined" % (name, n), joined == n, "%d joined" % joined)
    bound = n * (64 << 10) // 1024 * 2 + 4096
    R("%s: %d joined workers sending %d MiB frames unasked cost %d kB at most"
      % (name, n, mb, bound), rss1 - rss0 <= bound,
      "RSS %d kB -> %d kB (+%d kB)" % (rss0, rss1, rss1 - rss0))


def slowloris(name, addr, ok_fn, seconds=6.0, holders=40, tries=4, sources=5):
    """holders threads keep silent connections open from 127.0.0.2 ...
    127.0.0.(1 + sources) (more than the table holds), re-dialling each as
    soon as it is closed; meanwhile ok_fn() (a real handshake from
    127.0.0.1) must succeed every time."""
    import threading
    stop = time.time() + seconds
    host, port = addr.rsplit(":", 1)
    def hold(i):
        src = ("127.0.0.%d" % (2 + i % sources), 0)
        while time.time() < stop:
            try:
                s = socket.create_connection((host, int(port)), timeout=2,
                                             source_address=src)
                s.settimeout(1)
                while time.time() < stop:
                    try:
                        if s.recv(1) == b"":
                            break
                    except socket.timeout:
                        pass
                s.close()
            except OSError:
                time.sleep(0.01)
    ths = [threading.Thread(target=hold, args=(i,), daemon=True) for i in range(holders)]
    for t in ths:
        t.start()
    time.sleep(1.0)
    good = 0
    for _ in range(tries):
        good += bool(ok_fn())
        time.sleep(0.2)
    for t in ths:
        t.join()
    R("%s: %d silent connections re-dialled as they close; real handshakes served"
      % (name, holders), good == tries, "%d of %d served" % (good, tries))


def control_port_refusals(a, name, addr):
    """A malformed frame before the handshake, and a worker on the control
    port: each gets an ErrorReply (a worker never gets Ready)."""
    s = WL.connect(addr)
    s.settimeout(10)
    msg = ""
    try:
        s.sendall(WL.frame(b"\x0a\x05\x08"))   # hello claiming 5 bytes, holding 1
        msg = WL.error_message(WL.recv_frame(s))
    except (OSError, EOFError) as e:
        msg = "no reply: %s" % e
    s.close()
    R("%s: a malformed frame before the handshake gets an ErrorReply" % name, msg != "" and
      not msg.startswith("no reply"), msg)
    fp, nl, ne, embd = a.model_info
    s = WL.connect(addr)
    s.settimeout(10)
    try:
        why = WL.handshake(s, WL.ROLE_WORKER, WL.peerinfo(fp=fp, n_layer=nl, n_expert=ne,
                                                          n_embd=embd))
    except (OSError, EOFError) as e:
        why = "no reply: %s" % e
    s.close()
    R("%s: a worker gets an ErrorReply instead of Ready" % name,
      why is not None and "observers" in why, str(why))


def worker_part(a, tmp):
    w = L.Worker(a.worker, tmp, "worker", a.ct, launch=popen)
    try:
        if not R("worker starts", w.wait_ready(), w.text()[-500:]):
            return
        pid = w.p.pid
        probe_ok(a, w.addr, "worker: a valid request first", "valid")
        hold_partial_frames("worker", pid, w.addr)
        unknown_fields_raw("worker", pid, w.addr)
        unknown_fields_authenticated(a, "worker", pid, w.addr, "coordinator")
        connection_cap("worker", w.addr)
        amplified_requests(a, "worker", pid, w.addr)
        slowloris("worker", w.addr, lambda: subprocess.run(
            [a.probe, "--addr", w.addr, "--model", a.ct, "--role", "observer", "status"],
            capture_output=True, timeout=60, env=env()).returncode == 0)
        probe_ok(a, w.addr, "worker: serves a valid request after all that", "valid")
        probe_ok(a, w.addr, "worker: a closed connection's queued requests are dropped",
                 "cancel-on-close", 8, timeout=900)
        R("worker alive", w.alive())
    finally:
        rc = w.stop()
        coordinator_cap(a, tmp)
        R("worker exits 0", rc == 0, "rc=%s" % rc)
        text = w.text()
        reports = [l for l in text.splitlines() if "Sanitizer" in l or "runtime error" in l]
        R("worker: no sanitizer report", not reports, "\n".join(reports[:5]))


def coordinator_part(a, tmp):
    errp = os.path.join(tmp, "chat.err")
    errf = open(errp, "w")
    chat = subprocess.Popen([a.shoal, "chat", "--model", a.ct, "--accept-workers",
                             "127.0.0.1:0", "--control", "127.0.0.1:0", "--max-tokens", "4"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errf,
                            env=env())
    L.procs.append(chat)
    try:
        addr = L.control_addr(errp, p=chat)
        text = open(errp, errors="replace").read()
        m = re.search(r"workers join on (\d+\.\d+\.\d+\.\d+:\d+)", text)
        if not R("coordinator prints its control address", addr is not None, text[-500:]):
            return
        pid = chat.pid
        ports = [("control port", addr)]
        if m:
            ports.append(("accept port", m.group(1)))
        else:
            R.skip("coordinator accept port", "address not found in: " + text[-300:])
        for label, ad in ports:
            hold_partial_frames("coordinator " + label, pid, ad)
            unknown_fields_raw("coordinator " + label, pid, ad)
            connection_cap("coordinator " + label, ad)
        unknown_fields_authenticated(a, "coordinator control port", pid, addr, "observer")
        if m:
            rogue_workers(a, "coordinator accept port", pid, m.group(1))
        control_port_refusals(a, "coordinator control port", addr)
        slowloris("coordinator control port", addr,
                  lambda: L.query_status(a.shoal, addr, timeout=20)[0] == 0)
        rc, out, err = L.query_status(a.shoal, addr, "--json")
        R("coordinator: shoal status answers after all that", rc == 0, (out + err)[-300:])
        chat.stdin.close()
        crc = chat.wait(timeout=120)
        R("coordinator: chat exits 0 at end of input", crc == 0, "rc=%s" % crc)
    finally:
        if chat.poll() is None:
            chat.kill()
            chat.wait()
        errf.close()
        text = open(errp, errors="replace").read()
        reports = [l for l in text.splitlines() if "Sanitizer" in l or "runtime error" in l]
        R("coordinator: no sanitizer report", not reports, "\n".join(reports[:5]))


def silent_open(addr, sources, per_source=30):
    """per_source silent connections from each of 127.0.0.2 ..
    127.0.0.(1 + sources), one source after the other; how many are still
    open a second later (the rest were evicted)."""
    host, port = addr.rsplit(":", 1)
    socks = []
    for i in range(sources):
        for _ in range(per_source):
            try:
                socks.append(socket.create_connection(
                    (host, int(port)), timeout=10, source_address=("127.0.0.%d" % (2 + i), 0)))
            except OSError:
                pass
    time.sleep(1.0)
    still = sum(is_open(s) for s in socks)
    for s in socks:
        s.close()
    time.sleep(0.3)
    return still


def caps_check(name, addr, cap, per):
    """From one address exactly per stay open; from five, exactly cap
    (when 5 * per >= cap)."""
    one = silent_open(addr, 1)
    R("%s: silent connections from one address, %d held (its share)" % (name, per),
      one == per, "%d open" % one)
    five = silent_open(addr, 5)
    want = min(cap, 5 * per)
    R("%s: silent connections from five addresses, %d held (the cap)" % (name, want),
      five == want, "%d open" % five)


def caps_part(a, tmp):
    """The handshake caps as flags, on the worker and on the coordinator
    (its control and accept ports share one table)."""
    for flags, cap, per in (([], 16, 4),
                            (["--max-unauthenticated", "9",
                              "--max-unauthenticated-per-address", "3"], 9, 3),
                            (["--max-unauthenticated", "2"], 2, 2)):
        label = " ".join(flags) or "defaults"
        w = L.Worker(a.worker, tmp, "caps-w%d" % cap, a.ct, *flags, launch=popen)
        try:
            if R("worker starts (%s)" % label, w.wait_ready(), w.text()[-500:]):
                caps_check("worker (%s)" % label, w.addr, cap, per)
                probe_ok(a, w.addr, "worker (%s): serves a valid request after" % label,
                         "valid")
        finally:
            R("worker (%s) exits 0" % label, w.stop() == 0)
        errp = os.path.join(tmp, "caps-c%d.err" % cap)
        with open(errp, "w") as errf:
            chat = popen([a.shoal, "chat", "--model", a.ct, "--accept-workers",
                          "127.0.0.1:0", "--control", "127.0.0.1:0", "--max-tokens", "4"]
                         + flags, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         stderr=errf)
        L.procs.append(chat)
        try:
            addr = L.control_addr(errp, p=chat)
            if R("coordinator starts (%s)" % label, addr, open(errp).read()[-500:]):
                caps_check("coordinator control port (%s)" % label, addr, cap, per)
                R("coordinator (%s): shoal status answers after" % label,
                  L.query_status(a.shoal, addr, timeout=20)[0] == 0)
            chat.stdin.close()
            R("coordinator (%s) exits 0 at end of input" % label, chat.wait(timeout=120) == 0)
        finally:
            if chat.poll() is None:
                chat.kill()
                chat.wait()
    bad = [(["--max-unauthenticated", "0"], "--max-unauthenticated"),
           (["--max-unauthenticated", "4097"], "[1, 4096]"),
           (["--max-unauthenticated-per-address", "x"], "--max-unauthenticated-per-address"),
           (["--max-unauthenticated", "3", "--max-unauthenticated-per-address", "5"],
            "exceeds --max-unauthenticated 3")]
    for flags, want in bad:
        for who, cmd in (("worker", [a.worker, "--model", a.ct, "--listen", "127.0.0.1:0"]),
                         ("coordinator", [a.shoal, "run", "--model", a.ct, "--accept-workers",
                                          "127.0.0.1:0", "--prompt", "x"])):
            r = subprocess.run(cmd + flags, capture_output=True, text=True, timeout=60,
                               env=env())
            lines = r.stderr.strip().splitlines()
            R("%s %s: one-line usage error, exit 2" % (who, " ".join(flags)),
              r.returncode == 2 and len(lines) == 1 and want in lines[0],
              "rc=%d %s" % (r.returncode, r.stderr[-300:]))


def sigterm_part(a, tmp, runs=10):
    """SIGTERM as soon as the worker listens (before 'serving'), and
    SIGTERM as fast as they can be sent from 'serving' until it exits."""
    early = storm = 0
    bad = ([], [])
    for i in range(runs):
        log = os.path.join(tmp, "sig%d.log" % i)
        with open(log, "w") as lf:
            p = subprocess.Popen([a.worker, "--model", a.ct, "--listen", "127.0.0.1:0"],
                                 stdout=lf, stderr=subprocess.STDOUT, env=env())
        L.procs.append(p)
        want = "listening on" if i % 2 == 0 else "serving "
        t0 = time.time()
        while time.time() - t0 < 60 and p.poll() is None:
            if want in open(log, errors="replace").read():
                break
            time.sleep(0.001)
        t0 = time.time()
        while p.poll() is None and time.time() - t0 < 60:
            try:
                p.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                break
            if i % 2 == 0:
                time.sleep(0.002)
        try:
            rc = p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
        if rc == 0:
            if i % 2 == 0:
                early += 1
            else:
                storm += 1
        else:
            bad[i % 2].append("run %d (%s): rc=%s %s" % (i, want.strip(), rc,
                                                 open(log, errors="replace").read()[-300:]))
    R("SIGTERM from the 'listening' line on: the worker exits 0 (%d runs)" % ((runs + 1) // 2),
      early == (runs + 1) // 2, "\n".join(bad[0][:3]))
    R("SIGTERM after SIGTERM from 'serving' until exit: the worker exits 0 (%d runs)"
      % (runs // 2), storm == runs // 2, "\n".join(bad[1][:3]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--probe", required=True)
    ap.add_argument("--only", choices=["worker", "coordinator", "sigterm", "caps"])
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="shoal-peer-limits-")
    a.ct = os.path.join(tmp, "c")
    try:
        r = subprocess.run([a.shoal, "convert", L.MODEL, a.ct, "--experts", "int4"],
                           capture_output=True, text=True, timeout=300, env=env())
        if not R("convert the bundled model", r.returncode == 0, r.stderr[-500:]):
            return R.summary()
        a.model_info = inspect(a)
        if not R("inspect the container", a.model_info is not None):
            return R.summary()
        if a.only in (None, "worker"):
            worker_part(a, tmp)
        if a.only in (None, "coordinator"):
            coordinator_part(a, tmp)
        if a.only in (None, "sigterm"):
            sigterm_part(a, tmp)
        if a.only in (None, "caps"):
            caps_part(a, tmp)
    finally:
        L.kill_all()
        shutil.rmtree(tmp, ignore_errors=True)
    return R.summary()


if __name__ == "__main__":
    sys.exit(main())
