"""What admission keeps between calls: a play file read before, a bundle stored before.

Neither may ever change what a run is admitted with: an edited play is read again,
and a bundle gone from the database is written again.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

import tasks
from models import PlayBundle, Run
from tasks.admission import validate
from tasks.store.db import session_scope
from tests.support.paths import ROOT

NOOP = (ROOT / "examples" / "plays" / "noop.py").read_text()


def org() -> str:
    return f"reuse-{uuid.uuid4().hex[:8]}"


def stored_play(run_id: str) -> tuple[str, str | None]:
    """The run's play digest and the source stored under it."""
    with session_scope(readonly=True) as s:
        digest = s.scalar(sa.select(Run.play_digest).where(Run.id == run_id))
        assert digest is not None
        return digest, s.scalar(sa.select(PlayBundle.source)
                                .where(PlayBundle.digest == digest))


def test_a_play_edited_in_place_with_its_times_kept_is_read_again(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(validate, "_SETTLED_NS", 0)  # a file just written is kept at once
    play = tmp_path / "play.py"
    first = f"{NOOP}\n# version A {uuid.uuid4().hex}\n"
    play.write_text(first)
    assert validate.load_play(play) is validate.load_play(play)  # kept: the next read hits
    before = os.stat(play)
    second = first.replace("version A", "version B")  # the same size
    with play.open("r+") as f:  # the same inode
        f.write(second)
    os.utime(play, ns=(before.st_atime_ns, before.st_mtime_ns))  # and the same mtime
    handle = tasks.submit_run(play, org_id=org())
    assert stored_play(handle.id) == (hashlib.sha256(second.encode()).hexdigest(), second)


def test_a_play_replaced_by_another_file_is_read_again(pg_url: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(validate, "_SETTLED_NS", 0)
    play = tmp_path / "play.py"
    play.write_text(f"{NOOP}\n# one\n")
    tasks.submit_run(play, org_id=org())
    fresh = tmp_path / "fresh.py"
    fresh.write_text(f"{NOOP}\n# two\n")
    fresh.replace(play)  # how editors save: a new file renamed over the old
    handle = tasks.submit_run(play, org_id=org())
    assert stored_play(handle.id)[1] == f"{NOOP}\n# two\n"


def test_a_bundle_gone_from_the_database_is_written_again(pg_url: str, tmp_path: Path) -> None:
    play = tmp_path / "play.py"
    source = f"{NOOP}\n# {uuid.uuid4().hex}\n"
    play.write_text(source)
    o = org()
    first = tasks.submit_run(play, org_id=o)  # stores the bundle: the next submit skips it
    digest, _ = stored_play(first.id)
    with session_scope() as s:  # a clean-up outside playrun: the run, then its bundle
        s.execute(sa.delete(Run).where(Run.id == first.id))
        s.execute(sa.delete(PlayBundle).where(PlayBundle.digest == digest))
    again = tasks.submit_run(play, org_id=o)
    assert again.created and stored_play(again.id) == (digest, source)
