"""Private PostgreSQL and Redis servers the suite may restart (the shared ones on 5432 and
6379 are never touched), and a small tmpfs for the sandbox root."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
import redis

from bench.common import free_port, start_child


class PrivateRedis:
    """`redis-server` without persistence: a restart loses every key (the broker's too)."""

    def __init__(self, log_dir: Path) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("no redis-server on PATH")
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}"
        self.child = start_child("redis", [exe, "--port", str(self.port), "--bind", "127.0.0.1",
                                     "--save", "", "--appendonly", "no"], dict(os.environ),
                           log_dir)
        self.wait_up()

    def wait_up(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(redis.RedisError):
                if redis.Redis.from_url(self.url, socket_timeout=1).ping():
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"private redis not up: {self.child.output()[-2000:]}")
            time.sleep(0.05)

    def kill(self) -> None:
        self.child.stop(signal.SIGKILL)

    def start(self) -> None:
        self.child.start()

    def stop(self) -> None:
        self.child.stop()


def pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


class PrivatePostgres:
    """A throwaway cluster (initdb + pg_ctl, run as the `postgres` OS user when we are root:
    PostgreSQL refuses to run as root), trust auth on 127.0.0.1 and a free port."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="chaos-pg-"))
        os.chmod(self.dir, 0o755)
        self.data = self.dir / "data"
        self.logfile = self.dir / "pg.log"
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self._as_user(["initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                       "-E", "UTF8", "--no-sync"])
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}"
        self.start()

    def _as_user(self, argv: list[str]) -> None:
        cmd = [str(self.bindir / argv[0]), *argv[1:]]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed: {out.stderr[-2000:] or out.stdout[-2000:]}")

    def start(self) -> None:
        opts = (f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir} "
                "-c fsync=off -c max_connections=200")
        self._as_user(["pg_ctl", "-D", str(self.data), "-l", str(self.logfile), "-o", opts,
                       "-w", "-t", "60", "start"])

    def kill(self) -> None:
        """An immediate stop: no checkpoint, every session cut (as a crash or failover)."""
        self._as_user(["pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop"])

    def ping(self) -> bool:
        try:
            with psycopg.connect(self.url.replace("+psycopg", "") + "/postgres",
                                 connect_timeout=2):
                return True
        except psycopg.Error:
            return False

    def stop(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._as_user(["pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop"])
        shutil.rmtree(self.dir, ignore_errors=True)


class Tmpfs:
    """A small tmpfs mounted on `path` (the sandbox root) so the suite can fill it."""

    def __init__(self, path: Path, size_mb: int) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=755",
                              "tmpfs", str(path)], capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"mount -t tmpfs failed: {out.stderr.strip()}")
        self.filler = path / ".chaos-filler"

    def fill(self) -> None:
        """Write until ENOSPC: every later write in the sandbox root fails."""
        with contextlib.suppress(OSError), open(self.filler, "wb") as f:
            block = b"\0" * (1 << 20)
            while True:
                f.write(block)
                f.flush()

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True, check=False)
