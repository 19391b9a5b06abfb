"""Runtime sheet throughput: rows admitted and written per second through the play's
sheet client and a real gateway process, against a bare multi-row
INSERT ... ON CONFLICT of the same rows (same page size, one commit per page) on the
same PostgreSQL database.

    python bench/bench_sheets.py [-n 20000] [--page 500] [--write 200]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import bench_env, free_port

ROOT = Path(__file__).resolve().parent.parent
PLAY = ROOT / "tests" / "plays" / "sheet_enrich.py"


def start_gateway(env: dict[str, str]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-m", "tasks.cli.main", "gateway"], cwd=str(ROOT),
                            env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(env["PLAYRUN_GATEWAY_URL"] + "/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError("the gateway did not start")


def launched(org: str) -> SimpleNamespace:
    """A run of the sheet play, claimed and launched by hand; its runner token."""
    import sqlalchemy as sa

    from models import Outbox, db_now
    from tasks.acquisition.claim import Claimed, claim
    from tasks.admission.submit import admit
    from tasks.execution.launch import mark_launching
    from tasks.security import tokens
    from tasks.settings import get_settings
    from tasks.store.db import session_scope

    admitted = admit(PLAY, {}, org, None)
    with session_scope() as session:
        session.execute(sa.update(Outbox).where(Outbox.id == admitted.outbox_id)
                        .values(sent_at=db_now()))
        claimed = claim(session, admitted.run_id, worker_id="bench", lease_seconds=600)
    assert isinstance(claimed, Claimed)
    settings = get_settings()
    launch_id = mark_launching(claimed.fence, settings)
    assert launch_id is not None
    token = tokens.mint(org_id=org, run_id=admitted.run_id, generation=1, launch_id=launch_id,
                        capabilities=tokens.RUNNER_CAPABILITIES, ttl_s=3600,
                        secret=settings.secret_key)
    return SimpleNamespace(run_id=admitted.run_id, token=token)


class TimedGateway:
    def __init__(self, url: str) -> None:
        from tasks.execution import runner_client

        self.inner = runner_client.Gateway(url, None)
        self.seconds: dict[str, float] = {}

    def call(self, token: str, body: dict[str, Any]) -> Any:
        t0 = time.perf_counter()
        try:
            return self.inner.call(token, body)
        finally:
            action = body["action"]
            self.seconds[action] = self.seconds.get(action, 0.0) + time.perf_counter() - t0


def through_client(url: str, org: str, rows: list[dict[str, Any]], page: int,
                   write: int) -> tuple[float, dict[str, float], float]:
    """(map seconds, seconds per action, seconds of a second map: every row reused)."""
    from tasks.execution.runner_sheets import Sheet

    run = launched(org)
    gateway = TimedGateway(url)
    ctx = SimpleNamespace(_uplink=SimpleNamespace(gateway=gateway, token=run.token,
                                                  on_stop=print),
                          halted=None, run_id=run.run_id, log=lambda *_a, **_k: None)
    t0 = time.perf_counter()
    Sheet(ctx, "bench", page_rows=page, write_rows=write).map(
        rows, lambda r: {"letters": len(r["domain"])}, key="domain")
    map_s = time.perf_counter() - t0
    split = dict(gateway.seconds)
    t0 = time.perf_counter()
    Sheet(ctx, "bench", page_rows=page, write_rows=write).map(rows, lambda r: 0, key="domain")
    return map_s, split, time.perf_counter() - t0


def bare_insert(dsn: str, rows: list[dict[str, Any]], page: int) -> float:
    """The same rows as multi-row INSERT ... ON CONFLICT DO UPDATE, a commit per page."""
    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO sheets (org_id, play, name) VALUES ('bare', 'bare', 't')")
        sheet_id = conn.execute("SELECT id FROM sheets WHERE org_id = 'bare'").fetchone()[0]
        conn.commit()
        t0 = time.perf_counter()
        for start in range(0, len(rows), page):
            chunk = rows[start:start + page]
            values = ",".join(["(%s, %s, %s::jsonb, 'pending', 1)"] * len(chunk))
            params: list[Any] = []
            for row in chunk:
                params += [sheet_id, row["domain"], json.dumps(row)]
            conn.execute(
                "INSERT INTO sheet_rows (sheet_id, key, data, status, write_version) VALUES "
                + values + " ON CONFLICT (sheet_id, key) DO UPDATE SET data = excluded.data, "
                "status = 'pending', result = NULL, write_version = excluded.write_version "
                "WHERE sheet_rows.write_version < excluded.write_version", params)
            conn.commit()
        return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=20_000)
    parser.add_argument("--page", type=int, default=500)
    parser.add_argument("--write", type=int, default=200)
    args = parser.parse_args()
    rows = [{"domain": f"c{i:07d}.example.com", "n": i} for i in range(args.n)]
    with bench_env(redis_db=15) as env:
        sock_dir = Path(tempfile.mkdtemp(prefix="playrun-bench-gw-"))
        env.update({"PLAYRUN_GATEWAY_URL": f"http://127.0.0.1:{free_port()}",
                    "PLAYRUN_GATEWAY_SOCKET": str(sock_dir / "gateway.sock")})
        os.environ.update(env)
        from tasks.settings import reset_settings

        reset_settings()
        gateway = start_gateway(env)
        try:
            dsn = env["PLAYRUN_DATABASE_URL"].replace("+psycopg", "")
            bare_s = bare_insert(dsn, rows, args.page)
            map_s, split, reuse_s = through_client(env["PLAYRUN_GATEWAY_URL"],
                                                   f"bench-{secrets.token_hex(3)}", rows,
                                                   args.page, args.write)
        finally:
            os.killpg(gateway.pid, signal.SIGTERM)
            gateway.wait(timeout=30)
    n = args.n
    base = n / bare_s
    admit_s = split.get("sheet_start_with_intent", 0.0)
    write_s = split.get("sheet_write", 0.0)
    print(f"{n} rows, pages of {args.page}, writes of {args.write}")
    print(f"{'what':54} {'rows/s':>9} {'ratio to bare':>14}")
    for label, secs in [
            ("bare INSERT ... ON CONFLICT (page per commit)", bare_s),
            ("map: admit + fn + write back (whole call)", map_s),
            ("  of which admission requests (sheet_start_with_intent)", admit_s),
            ("  of which row writes (sheet_write)", write_s),
            ("map again in the same run: all rows reused", reuse_s)]:
        rate = n / secs if secs else float("inf")
        print(f"{label:54} {rate:9.0f} {rate / base:14.3f}")


if __name__ == "__main__":
    main()
