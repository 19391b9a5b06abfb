"""Fake runners that speak the real gateway protocol, thousands to one process.

`python -m tasks.sandbox.fake_runners ROOT` hosts the runners of `fake` sandboxes whose
script asks for hosted runners: instead of a process per sandbox, the provider drops a
launch request in ROOT/.fake-runs/ and this process runs it as a coroutine that
heartbeats, delivers progress, writes result.json and an exit record, and pushes
`complete`, exactly as runner.py would. What each run does comes from its input:
`{"fake": {"seconds": 2, "progress": 3, "output": {...}, "hang": false}}`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

SPOOL_DIR = ".fake-runs"
EXIT_FILE = ".fake-exit.json"
HOSTED_MARK = ".fake-hosted"
SCAN_EVERY_S = 0.02
PUSH_FOR_S = 60.0


async def _post(env: dict[str, str], token: str, body: dict[str, Any]) -> dict[str, Any]:
    """One HTTP/1.1 request to the gateway, over its Unix socket when there is one."""
    socket_path = env.get("PLAYRUN_GATEWAY_SOCKET", "")
    if socket_path and os.path.exists(socket_path):
        reader, writer = await asyncio.open_unix_connection(socket_path)
    else:
        url = urlsplit(env["PLAYRUN_GATEWAY_URL"])
        reader, writer = await asyncio.open_connection(url.hostname, url.port or 80)
    data = json.dumps(body).encode()
    writer.write(b"POST /v1/runtime HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n"
                 b"Content-Type: application/json\r\n"
                 + f"Authorization: Bearer {token}\r\nContent-Length: {len(data)}\r\n\r\n"
                 .encode() + data)
    await writer.drain()
    raw = await reader.read()
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    head, _, payload = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    doc = json.loads(payload or b"{}")
    if status >= 500:
        raise ConnectionError(f"HTTP {status}")
    return {"status": status, **doc}


def _write(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


class FakeRun:
    def __init__(self, request: dict[str, Any]) -> None:
        self.dir = Path(request["dir"])
        self.env: dict[str, str] = request["env"]
        self.done = asyncio.Event()
        try:
            doc = json.loads((self.dir / "input.json").read_text())
        except (OSError, ValueError):
            doc = {}
        fake = doc.get("fake", {}) if isinstance(doc, dict) else {}
        self.behaviour: dict[str, Any] = fake if isinstance(fake, dict) else {}

    def alive(self) -> bool:
        return self.dir.is_dir()

    async def heartbeat(self) -> None:
        interval = float(self.env.get("PLAYRUN_HEARTBEAT_S", "5"))
        while not self.done.is_set() and self.alive():
            with contextlib.suppress(TimeoutError):  # first beat after one interval, as runner.py
                await asyncio.wait_for(self.done.wait(), interval)
            if self.done.is_set() or not self.alive():
                break
            with contextlib.suppress(OSError, ValueError, ConnectionError):
                answer = await _post(self.env, self.env["PLAYRUN_TOKEN"], {"action": "heartbeat"})
                result = answer.get("result") or {}
                if answer["status"] != 200 or result.get("cancel"):
                    self.done.set()  # cancelled or fenced out: stop, like runner.py
        self.done.set()  # deleted under it: the run is over

    async def push(self, body: dict[str, Any], token: str) -> None:
        deadline = asyncio.get_running_loop().time() + PUSH_FOR_S
        while self.alive() and asyncio.get_running_loop().time() < deadline:
            try:
                await _post(self.env, token, body)
                return
            except (OSError, ValueError, ConnectionError):
                await asyncio.sleep(0.5)

    async def play(self) -> None:
        beat = asyncio.create_task(self.heartbeat())
        try:
            if self.behaviour.get("hang"):
                await self.done.wait()  # never ends by itself: a cancel or the deadline does
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.done.wait(), float(self.behaviour.get("seconds", 0)))
            if self.done.is_set() or not self.alive():
                return
            count = int(self.behaviour.get("progress", 0))
            if count:
                await self.push({
                    "action": "append_run_events", "events": [
                        {"seq": i + 1, "message": "fake progress", "fields": {"i": i}}
                        for i in range(count)],
                    "idempotency_key": f"{self.env['PLAYRUN_LAUNCH_ID']}:1-{count}",
                    "delivery_lease_owner": "fake-runner"}, self.env["PLAYRUN_PROJECTION_TOKEN"])
            result = {"status": "succeeded", "output": self.behaviour.get("output", {"fake": True})}
            _write(self.dir / "result.json", result)
            _write(self.dir / EXIT_FILE, {"exit_code": 0, "timed_out": False})
            await self.push({"action": "complete", "result": result}, self.env["PLAYRUN_TOKEN"])
        finally:
            self.done.set()
            await beat


async def host(root: Path) -> None:
    spool = root / SPOOL_DIR
    spool.mkdir(parents=True, exist_ok=True)
    running: set[asyncio.Task[None]] = set()
    print(f"fake runner host ready on {spool}", flush=True)
    while True:
        for entry in os.scandir(spool):
            if not entry.name.endswith(".json"):
                continue
            try:
                request = json.loads(Path(entry.path).read_text())
                os.unlink(entry.path)
            except (OSError, ValueError):
                continue
            task = asyncio.create_task(FakeRun(request).play())
            running.add(task)
            task.add_done_callback(running.discard)
        await asyncio.sleep(SCAN_EVERY_S)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("root", type=Path)
    asyncio.run(host(parser.parse_args().root))


if __name__ == "__main__":
    main()
