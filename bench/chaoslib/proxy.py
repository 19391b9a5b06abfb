"""A TCP proxy with a fault switch, run on its own thread: the stack's PostgreSQL and
Redis URLs point through it so the suite can slow, cut or black-hole the connections.

Modes: `pass`; `delay` (each chunk waits delay_ms before it is forwarded); `drop` (every
open connection is reset and new ones are closed at once, as a restarted NAT or load
balancer does); `blackhole` (nothing is forwarded and nothing is answered; connections
stall; when the mode ends they are reset, as a partition that heals after a timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from enum import Enum

from bench.common import free_port


class Mode(Enum):
    PASS = "pass"
    DELAY = "delay"
    DROP = "drop"
    BLACKHOLE = "blackhole"


class Proxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self.mode = Mode.PASS
        self.delay_s = 0.0
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._serve, daemon=True, name="chaos-proxy")
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the proxy did not start")

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def boot() -> None:
            self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
            self._ready.set()

        self._loop.run_until_complete(boot())
        self._loop.run_forever()

    def set_mode(self, mode: Mode, delay_ms: float = 0.0) -> None:
        """Switch the fault (thread-safe); leaving drop or black-hole resets what is open."""
        def switch() -> None:
            old, self.mode, self.delay_s = self.mode, mode, delay_ms / 1000
            if mode is Mode.DROP or old is Mode.BLACKHOLE:
                self._reset_all()
        self._loop.call_soon_threadsafe(switch)

    def _reset_all(self) -> None:
        for writer in list(self._writers):
            with contextlib.suppress(Exception):
                writer.transport.abort()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode is Mode.DROP:
            writer.transport.abort()
            return
        self._writers.add(writer)
        while self.mode is Mode.BLACKHOLE and writer in self._writers:
            await asyncio.sleep(0.05)  # a new connection hangs: no SYN-ACK from the far side
        if writer not in self._writers:
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            self._writers.discard(writer)
            writer.transport.abort()
            return
        self._writers.add(up_writer)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        for w in (writer, up_writer):
            self._writers.discard(w)
            w.transport.abort()

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                while self.mode is Mode.BLACKHOLE and dst in self._writers:
                    await asyncio.sleep(0.05)
                if self.delay_s and self.mode is Mode.DELAY:
                    await asyncio.sleep(self.delay_s)
                if dst not in self._writers:
                    return
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            dst.transport.abort()  # one side gone: the other goes too

    def close(self) -> None:
        def stop() -> None:
            self._reset_all()
            if self._server is not None:
                self._server.close()
            self._loop.stop()
        self._loop.call_soon_threadsafe(stop)
        self._thread.join(timeout=10)
