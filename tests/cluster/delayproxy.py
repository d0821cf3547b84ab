#!/usr/bin/env python3
"""delayproxy: a TCP forwarder that adds a one-way delay in each direction,
for a link's round trip where the kernel has no netem (../shared/TESTING.md).

  delayproxy.py LISTEN_ADDR:PORT TARGET_ADDR:PORT DELAY_MS

Every chunk read from one side is written to the other DELAY_MS later, in
order, so a request/answer exchange through it takes 2 x DELAY_MS more than
without it; the rate stays whatever the links' tbf allows. Prints
"listening" once it accepts connections. Runs until killed.

Each direction is a reader thread and a writer thread that sleeps until a
chunk is due (clock_nanosleep: tens of microseconds late at most). An
asyncio loop waits in epoll, whose timeout is whole milliseconds: a 0.05 ms
delay became 1 ms each way, and a "0.1 ms" round trip 2.5 ms.
"""
import queue
import socket
import sys
import threading
import time


def pump(src, dst, delay):
    """Copy src to dst, each chunk delay seconds after it arrived; at the
    end of src, end dst's sending side."""
    q = queue.SimpleQueue()

    def reader():
        try:
            while True:
                data = src.recv(1 << 18)
                q.put((time.monotonic() + delay, data))
                if not data:
                    return
        except OSError:
            q.put((0.0, b""))

    threading.Thread(target=reader, daemon=True).start()
    try:
        while True:
            due, data = q.get()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if not data:
                break
            dst.sendall(data)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def serve(client, target, delay):
    """One accepted connection: dial the target, pump both ways, close."""
    try:
        upstream = socket.create_connection(target)
    except OSError:
        client.close()
        return
    for s in (client, upstream):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    back = threading.Thread(target=pump, args=(upstream, client, delay), daemon=True)
    back.start()
    pump(client, upstream, delay)
    back.join()
    client.close()
    upstream.close()


def main(listen, target, delay):
    lhost, lport = listen.rsplit(":", 1)
    thost, tport = target.rsplit(":", 1)
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((lhost, int(lport)))
    srv.listen(64)
    print("listening", flush=True)
    while True:
        client, _ = srv.accept()
        threading.Thread(target=serve, args=(client, (thost, int(tport)), delay),
                         daemon=True).start()


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    try:
        main(sys.argv[1], sys.argv[2], float(sys.argv[3]) / 1e3)
    except KeyboardInterrupt:
        pass
