#!/usr/bin/env python3
"""delayproxy: a TCP forwarder that adds a one-way delay in each direction,
for a link's round trip where the kernel has no netem (../shared/TESTING.md).

  delayproxy.py LISTEN_ADDR:PORT TARGET_ADDR:PORT DELAY_MS

Every chunk read from one side is written to the other DELAY_MS later, in
order, so a request/answer exchange through it takes 2 x DELAY_MS more than
without it; the rate stays whatever the links' tbf allows. Prints
"listening" once it accepts connections. Runs until killed.
"""
import asyncio
import sys


async def pump(reader, writer, delay):
    """Copy reader to writer, each chunk delay seconds after it arrived."""
    loop = asyncio.get_running_loop()
    queue = asyncio.Queue()

    async def sender():
        while True:
            due, data = await queue.get()
            if data is None:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        try:
            writer.write_eof()
        except OSError:
            pass

    task = asyncio.ensure_future(sender())
    try:
        while True:
            data = await reader.read(1 << 18)
            queue.put_nowait((loop.time() + delay, data or None))
            if not data:
                break
        await task
    except (ConnectionError, OSError):
        task.cancel()
    finally:
        writer.close()


async def main(listen, target, delay):
    lhost, lport = listen.rsplit(":", 1)
    thost, tport = target.rsplit(":", 1)

    async def handle(creader, cwriter):
        try:
            treader, twriter = await asyncio.open_connection(thost, int(tport))
        except OSError:
            cwriter.close()
            return
        await asyncio.gather(pump(creader, twriter, delay), pump(treader, cwriter, delay),
                             return_exceptions=True)

    server = await asyncio.start_server(handle, lhost, int(lport))
    print("listening", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3]) / 1e3))
