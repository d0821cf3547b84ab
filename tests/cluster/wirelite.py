"""wirelite: a minimal shoal wire client for tests that play a hostile peer
(docs/PROTOCOL.md): a 4-byte little-endian length, then one protobuf
Frame. Only what test_peer_limits.py needs: the keyless handshake as a
connector, hand-built ExpertRequests and partial frames, and decoding of
the oneof field number and an ErrorReply's message.
"""
import os
import socket
import struct

ROLE_COORD, ROLE_WORKER, ROLE_OBS = 1, 2, 3
HELLO, AUTH, READY, ERROR = 1, 2, 3, 11


def varint(n):
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def fv(field, n):
    """A varint field."""
    return varint(field << 3) + varint(n)


def fb(field, data):
    """A length-delimited field."""
    return varint((field << 3) | 2) + varint(len(data)) + data


def fd(field, x):
    """A double field."""
    return varint((field << 3) | 1) + struct.pack("<d", x)


def frame(body):
    return struct.pack("<I", len(body)) + body


def _rd_varint(buf, i):
    n = s = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << s
        s += 7
        if not b & 0x80:
            return n, i


def parse(buf):
    """[(field, wiretype, value)] of one message level."""
    i, out = 0, []
    while i < len(buf):
        key, i = _rd_varint(buf, i)
        f, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _rd_varint(buf, i)
        elif wt == 2:
            n, i = _rd_varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError("wire type %d" % wt)
        out.append((f, wt, v))
    return out


def kind(body):
    """The Frame oneof field number of a frame body (HELLO, READY, ERROR...)."""
    p = parse(body)
    return p[0][0] if p else None


def error_message(body):
    """An ErrorReply's message, or '' for another frame."""
    p = parse(body)
    if not p or p[0][0] != ERROR:
        return ""
    d = {f: v for f, _, v in parse(p[0][2])}
    return d.get(3, b"").decode(errors="replace")


def hello(role):
    return fb(1, fv(1, 1) + fv(2, role) + fb(3, os.urandom(32)))


def peerinfo(fp="", n_layer=0, n_expert=0, n_embd=0, coverage=b"", model_type="",
             name="wirelite"):
    return (fb(1, name.encode()) + fb(2, b"wirelite") + fb(3, fp.encode()) +
            fb(4, model_type.encode()) + fv(5, n_layer) + fv(6, n_expert) + fv(7, n_embd) +
            fb(8, coverage) + fv(9, 1) + fd(10, 100.0) + fd(11, 1.0) + fv(12, 0) +
            fv(13, 0) + fv(14, 64 << 20) + fb(15, b"BF16"))


def connect(addr, timeout=10):
    host, port = addr.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=timeout)


def recv_exact(s, n):
    b = bytearray()
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise EOFError("closed after %d of %d bytes" % (len(b), n))
        b += c
    return bytes(b)


def recv_frame(s):
    return recv_exact(s, struct.unpack("<I", recv_exact(s, 4))[0])


def handshake(s, role, info):
    """Keyless handshake as the connector. Returns None on Ready, else the
    text of what came instead (an ErrorReply's message)."""
    s.sendall(frame(hello(role)))
    h = recv_frame(s)
    if kind(h) != HELLO:
        return error_message(h) or "frame %s instead of hello" % kind(h)
    s.sendall(frame(fb(2, fb(1, b"") + fb(2, info))))
    r = recv_frame(s)
    if kind(r) != READY:
        return error_message(r) or "frame %s instead of ready" % kind(r)
    return None


def expert_request(rid, layer, n_rows, n_embd, experts):
    """An ExpertRequest frame body: n_rows rows of 0.01, every listed expert
    taking every row (its reply: len(experts) x n_rows x n_embd f32)."""
    hidden = struct.pack("<f", 0.01) * (n_embd * n_rows)
    rows = fb(2, b"".join(varint(i) for i in range(n_rows)))
    ex = b"".join(fb(6, fv(1, e) + rows) for e in experts)
    return fb(4, fv(1, rid) + fv(2, layer) + fv(3, n_rows) + fv(4, n_embd) + fb(5, hidden) + ex)


def partial_request(announce, send):
    """The first `send` bytes of an ExpertRequest frame announcing `announce`
    body bytes (the rest never comes)."""
    head = fb(4, fv(1, 1))[:3]
    return struct.pack("<I", announce) + head + b"\0" * (send - len(head))
