"""Slow HTTP clients for the serve tests: n sockets that each send a
request head one byte at a time, a byte every `every` seconds, for ever
(the head never ends), and open a new socket `reconnect` seconds after the
server closes one. Runs on its own thread (selectors); stop() closes all.

    with SlowSockets(port, 200) as slow:
        ...            # the server is under attack meanwhile
    slow.closed        # sockets the server closed
"""
import selectors
import socket
import threading
import time

HEAD = (b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")


class SlowSockets:
    def __init__(self, port, n, every=2.0, reconnect=1.0, body=False, host="127.0.0.1"):
        """body: send a whole head announcing a large body, then trickle the
        body instead of the head."""
        self.port, self.n, self.every, self.reconnect = port, n, every, reconnect
        self.host = host
        self.first = HEAD if not body else (
            b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{")
        self.closed = 0       # sockets the server closed
        self.opened = 0
        self.refused = 0      # connects that failed
        self.lifetimes = []   # seconds each closed socket lived
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self):
        self._t.start()
        # wait until every socket has connected once
        deadline = time.time() + 30
        while self.opened < self.n and time.time() < deadline:
            time.sleep(0.05)

    def stop(self):
        self._stop.set()
        self._t.join(30)

    def _open(self, sel, now):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect((self.host, self.port))
        except BlockingIOError:
            pass
        except OSError:
            s.close()
            self.refused += 1
            return False
        sel.register(s, selectors.EVENT_READ, {"born": now, "next": now, "sent": 0})
        self.opened += 1
        return True

    def _run(self):
        sel = selectors.DefaultSelector()
        now = time.time()
        pending = []   # times at which to open a socket
        for _ in range(self.n):
            self._open(sel, now)
        while not self._stop.is_set():
            now = time.time()
            for ev, _ in sel.select(timeout=0.05):
                s = ev.fileobj
                try:
                    gone = s.recv(4096) == b""
                except BlockingIOError:
                    gone = False
                except OSError:
                    gone = True
                if gone:
                    self.closed += 1
                    self.lifetimes.append(now - ev.data["born"])
                    sel.unregister(s)
                    s.close()
                    pending.append(now + self.reconnect)
            for key in list(sel.get_map().values()):
                d = key.data
                if now < d["next"]:
                    continue
                d["next"] = now + self.every
                # the first send: the start (incomplete); then a byte at a time
                chunk = self.first[:-1] if d["sent"] == 0 else b"x"
                try:
                    key.fileobj.send(chunk)
                    d["sent"] += 1
                except BlockingIOError:
                    pass
                except OSError:
                    pass   # the read side reports the close
            due = [t for t in pending if t <= now]
            pending = [t for t in pending if t > now]
            for _ in due:
                if not self._open(sel, now):
                    pending.append(now + self.reconnect)
        for key in list(sel.get_map().values()):
            key.fileobj.close()
        sel.close()
