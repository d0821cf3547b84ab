#!/usr/bin/env python3
"""A hostile mDNS host for test_discover.py: for SECONDS, sends unsolicited
mDNS responses announcing COUNT `_shoal._tcp` services (PTR, SRV, TXT and A
records in one packet each), from port 5353 to 224.0.0.251 on the interface
that has ADDR, again every 0.3 s.

--mode malformed: every service is wrong in its own way (in turn): another
  cluster's keyid; 20 TXT strings of 255 bytes; v=2 with the right keyid;
  a keyid that is not hex; a name full of control bytes and a TXT string
  with a NUL; an A record that is not 4 bytes. None may be kept.
--mode copied: every service carries the right keyid (it is not secret:
  any host on the LAN sees it) and a bogus address 10.B.251.N: a browser
  must keep at most its cap, and the handshake would refuse them.

usage: mdns_flood.py --addr A.B.C.D --keyid HEX16 --count N --mode M --seconds S
"""
import argparse
import socket
import struct
import time

MDNS = ("224.0.0.251", 5353)


def name(*labels):
    """A DNS name from its labels (str or bytes), uncompressed."""
    out = b""
    for label in labels:
        if isinstance(label, str):
            label = label.encode()
        out += bytes([len(label)]) + label
    return out + b"\0"


def rr(owner, rtype, rdata, cache_flush=True):
    cls = 0x8001 if cache_flush else 0x0001
    return owner + struct.pack("!HHIH", rtype, cls, 120, len(rdata)) + rdata


def txt(strings):
    return b"".join(bytes([len(s)]) + s for s in strings)


def service(i, mode, keyid, octet):
    inst = b"flood-%d" % i
    txts = [b"v=1", b"keyid=" + keyid]
    host = name("flood-host-%d" % i, "local")
    a_rdata = socket.inet_aton("10.%d.251.%d" % (octet, i % 250 + 1))
    if mode == "malformed":
        kind = i % 6
        if kind == 0:
            txts = [b"v=1", b"keyid=0123456789abcdef"]
        elif kind == 1:
            txts = [b"keyid=" + keyid] + [b"x" * 255] * 19
        elif kind == 2:
            txts = [b"v=2", b"keyid=" + keyid]
        elif kind == 3:
            txts = [b"v=1", b"keyid=zzzzzzzzzzzzzzzz"]
        elif kind == 4:
            inst = b"\x01\x02\x1b[31m\xff" * 8
            txts = [b"v=1", b"keyid=" + keyid[:8] + b"\0" + keyid[9:]]
        else:
            a_rdata = b"\x0a\x00"     # a short A record
    full = name(inst, "_shoal", "_tcp", "local")
    ptr = rr(name("_shoal", "_tcp", "local"), 12, full, cache_flush=False)
    srv = rr(full, 33, struct.pack("!HHH", 0, 0, 9000 + i) + host)
    tx = rr(full, 16, txt(txts))
    a = rr(host, 1, a_rdata)
    return struct.pack("!HHHHHH", 0, 0x8400, 0, 4, 0, 0) + ptr + srv + tx + a


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--addr", required=True)
    ap.add_argument("--keyid", required=True)
    ap.add_argument("--count", type=int, default=300)
    ap.add_argument("--mode", choices=("malformed", "copied"), required=True)
    ap.add_argument("--seconds", type=float, default=8)
    a = ap.parse_args()
    octet = int(a.addr.split(".")[1])
    packets = [service(i, a.mode, a.keyid.encode(), octet) for i in range(a.count)]
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 5353))   # responders must come from 5353
    s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 255)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(a.addr))
    end = time.time() + a.seconds
    while time.time() < end:
        for p in packets:
            s.sendto(p, MDNS)
        time.sleep(0.3)


if __name__ == "__main__":
    main()
