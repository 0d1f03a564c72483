"""A network between the benchmark's clients and the server: a relay that delays and paces.

This machine's kernel has no ``netem``, so the link is emulated in user space, as toxiproxy's
``latency`` and ``bandwidth`` toxics do: an asyncio TCP relay on loopback that forwards each
accepted connection to its target and

* delays every byte by half the round-trip time in each direction (``--rtt-ms``);
* serializes each direction at the link's rate (``--mbit``; both directions, each its own
  link shared by every connection through the relay, as one access link is), in pieces of at
  most ``PIECE_BYTES`` so that a large write is spread over its transmission time;
* holds a new connection's first bytes for one extra round trip: the client's TCP handshake
  to the relay is instant on loopback, but over a real link its data can leave only after
  the SYN-ACK came back.

What it does not model: TCP's own congestion window growth (slow start) and loss and
retransmission; the relay's sockets are loopback TCP, whose window opens at once, and nothing
is dropped. A link's buffer is bounded (``QUEUE_PIECES`` pieces per connection and direction),
after which the relay stops reading, so the sender feels back-pressure; it is not a router's
queue with its drops. Timer granularity: a release is at most ~1 ms late (asyncio's timers).

Run: ``python -m bidi_responses.bench.netem --rtt-ms 20 --mbit 10 --to 127.0.0.1:50051``
prints ``relay 127.0.0.1:PORT -> 127.0.0.1:50051`` per target once listening.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys
from collections.abc import Sequence

__all__ = ["PIECE_BYTES", "QUEUE_PIECES", "Link", "Relay", "main"]

#: Bytes paced as one unit on a rate-limited link (~6.5 ms at 10 Mbit/s).
PIECE_BYTES = 8192
#: Pieces one connection may have in flight per direction before the relay stops reading.
QUEUE_PIECES = 512
_READ_BYTES = 65536


class Link:
    """One direction of the emulated link: a propagation delay and a transmission rate."""

    def __init__(self, delay_s: float, bytes_per_s: float | None) -> None:
        self.delay_s = delay_s
        self.bytes_per_s = bytes_per_s
        self._free_at = 0.0

    def release_at(self, now: float, size: int) -> float:
        """When ``size`` bytes handed to the link at ``now`` arrive at the far end."""
        if self.bytes_per_s is None:
            return now + self.delay_s
        # The link sends one piece after another: this one starts when the last is out.
        self._free_at = max(now, self._free_at) + size / self.bytes_per_s
        return self._free_at + self.delay_s


class Relay:
    """Relays connections accepted on loopback to ``target`` over two ``Link``s."""

    def __init__(
        self, target: tuple[str, int], rtt_s: float, mbit: float | None, listen_port: int = 0
    ) -> None:
        self.target = target
        self.rtt_s = rtt_s
        rate = mbit * 1e6 / 8 if mbit else None
        self.up = Link(rtt_s / 2, rate)
        self.down = Link(rtt_s / 2, rate)
        self.listen_port = listen_port
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        """Listen; return the port."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.listen_port)
        port: int = self._server.sockets[0].getsockname()[1]
        self.listen_port = port
        return port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        # Over a real link the client's data leaves one round trip after its SYN.
        not_before = loop.time() + self.rtt_s
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        for sock_writer in (writer, up_writer):
            sock = sock_writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await asyncio.gather(
                self._pump(reader, up_writer, self.up, not_before),
                self._pump(up_reader, writer, self.down, 0.0),
            )
        except (ConnectionError, OSError):
            pass
        finally:
            self._tasks.discard(task)
            for w in (writer, up_writer):
                w.close()

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        link: Link,
        not_before: float,
    ) -> None:
        """One direction of one connection: read, schedule on the link, deliver on time."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(QUEUE_PIECES)
        loop = asyncio.get_running_loop()

        async def deliver() -> None:
            while True:
                release, data = await queue.get()
                delay = release - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)  # the emulated link's delay is the point
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()

        delivering = asyncio.ensure_future(deliver())
        try:
            while True:
                data = await reader.read(_READ_BYTES)
                now = max(loop.time(), not_before)
                if not data:
                    await queue.put((now + link.delay_s, b""))
                    break
                size = PIECE_BYTES if link.bytes_per_s is not None else len(data)
                for start in range(0, len(data), size):
                    piece = data[start : start + size]
                    await queue.put((link.release_at(now, len(piece)), piece))
            await delivering
        except BaseException:
            delivering.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
                await delivering
            raise


def _target(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


async def serve(targets: Sequence[tuple[str, int]], rtt_ms: float, mbit: float | None) -> None:
    """Relay to every target until SIGTERM or SIGINT; print each relay's port."""
    relays = [Relay(t, rtt_ms / 1000, mbit) for t in targets]
    for relay in relays:
        port = await relay.start()
        host, target_port = relay.target
        print(f"relay 127.0.0.1:{port} -> {host}:{target_port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for relay in relays:
        await relay.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--to", action="append", required=True, help="HOST:PORT to relay to")
    parser.add_argument("--rtt-ms", type=float, default=0.0, help="round-trip time (ms)")
    parser.add_argument("--mbit", type=float, default=0.0, help="rate each way (0: unlimited)")
    args = parser.parse_args(argv)
    asyncio.run(serve([_target(t) for t in args.to], args.rtt_ms, args.mbit or None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
