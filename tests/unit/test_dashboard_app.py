"""`playrun dashboard` in process (starlette's TestClient) on SQLite: sign-in, the pages an
operator reads, the one write (run again) behind a confirmation and a CSRF token."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from starlette.testclient import TestClient

import tasks
from tasks.acquisition.starthistory import Sample
from tasks.admission import placement
from tasks.broker.publish import StubPublisher
from tasks.cli.tables import SHORT_ID
from tasks.dashboard import fleet
from tasks.dashboard.app import create_app
from tasks.dashboard.auth import COOKIE, Access
from tasks.settings import get_settings, reset_settings
from tasks.worker import jobs
from tests.support.paths import HELLO

READ, WRITE = "read-" + "r" * 24, "write-" + "w" * 24
HOSTILE = '<img src=x onerror="alert(1)">'


@pytest.fixture
def dashboard(sqlite_db: str, published: StubPublisher) -> Iterator[TestClient]:
    with TestClient(create_app(get_settings(), Access(READ, WRITE)),
                    follow_redirects=False) as client:
        yield client


def as_(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def submit(org: str | None = None, name: str = "Ada") -> str:
    return tasks.submit_run(HELLO, {"name": name}, org_id=org or f"dash-{uuid.uuid4().hex[:6]}").id


def test_pages_need_a_token_and_carry_the_security_headers(dashboard: TestClient) -> None:
    refused = dashboard.get("/runs")
    assert refused.status_code == 401
    assert refused.headers["www-authenticate"].startswith("Bearer")
    assert "script-src" not in refused.headers["content-security-policy"]
    assert refused.headers["x-frame-options"] == "DENY"
    assert dashboard.get("/runs", headers=as_("nope")).status_code == 401
    assert dashboard.get("/healthz").text == "ok"
    assert "text/css" in dashboard.get("/style.css").headers["content-type"]
    assert dashboard.get("/", headers=as_(READ)).headers["location"] == "/runs"


def test_signing_in_sets_a_cookie_and_goes_only_to_a_local_page(dashboard: TestClient) -> None:
    assert "Sign in" in dashboard.get("/login?next=/fleet").text
    wrong = dashboard.post("/login", data={"token": "guess", "next": "/fleet"})
    assert wrong.status_code == 401 and "not a dashboard token" in wrong.text
    away = dashboard.post("/login", data={"token": READ, "next": "//evil.example/x"})
    assert (away.status_code, away.headers["location"]) == (303, "/runs")
    ok = dashboard.post("/login", data={"token": READ, "next": "/fleet"})
    assert ok.headers["location"] == "/fleet"
    assert "httponly" in ok.headers["set-cookie"].lower()
    assert dashboard.get("/runs").status_code == 200  # the cookie the client kept
    dashboard.cookies.set(COOKIE, "tampered" + dashboard.cookies[COOKIE])
    assert dashboard.get("/runs").status_code == 401
    out = dashboard.post("/logout")
    assert out.headers["location"] == "/login"
    not_a_form = dashboard.post("/login", content=b"{}",
                                headers={"content-type": "application/json"})
    assert not_a_form.status_code == 400 and "INPUT_INVALID" in not_a_form.text


def test_the_runs_page_lists_filters_and_escapes(dashboard: TestClient) -> None:
    org = f"dash-{uuid.uuid4().hex[:6]}"
    first = submit(org, HOSTILE)
    other = submit()
    tasks.cancel_run(other)
    page = dashboard.get("/runs", headers=as_(READ))
    assert page.status_code == 200 and first in page.text and other in page.text
    only = dashboard.get(f"/runs?org={org}", headers=as_(READ)).text
    assert first in only and other not in only
    cancelled = dashboard.get("/runs?status=cancelled", headers=as_(READ)).text
    assert other in cancelled and first not in cancelled
    bad = dashboard.get("/runs?since=not-a-time", headers=as_(READ))
    assert bad.status_code == 400
    jump = dashboard.get(f"/runs?run={first[:SHORT_ID]}", headers=as_(READ))
    assert jump.headers["location"] == f"/runs/{first}"


def test_the_run_page_shows_the_run_and_escapes_what_a_play_wrote(
        dashboard: TestClient) -> None:
    run_id = submit(name=HOSTILE)
    page = dashboard.get(f"/runs/{run_id}", headers=as_(READ))
    assert page.status_code == 200 and run_id in page.text and "queued" in page.text
    assert HOSTILE not in page.text
    assert dashboard.get(f"/runs/{run_id[:SHORT_ID]}", headers=as_(READ)).headers[
        "location"] == f"/runs/{run_id}"
    missing = dashboard.get("/runs/" + "0" * 32, headers=as_(READ))
    assert missing.status_code == 404 and "RUN_NOT_FOUND" in missing.text
    tail = dashboard.get(f"/runs/{run_id}?after=0&tail=1", headers=as_(READ))
    assert tail.status_code == 200


def test_the_fleet_page_shows_orgs_holding_capacity_and_a_redis_outage(
        dashboard: TestClient, fake_stack: object, monkeypatch: pytest.MonkeyPatch) -> None:
    org = f"fleet-{uuid.uuid4().hex[:6]}"
    run_id = submit(org)
    assert jobs.start_attempt(run_id) == "launched"
    monkeypatch.setenv("PLAYRUN_REDIS_URL", "redis://127.0.0.1:1/0")  # nothing listens
    reset_settings()
    page = dashboard.get("/fleet", headers=as_(READ))
    assert page.status_code == 200
    assert "Start-rate history unavailable: Redis did not answer" in page.text
    row = re.search(rf'<td><a href="/runs\?org={org}">{org}</a></td><td>(\d+)</td>', page.text)
    assert row is not None and row.group(1) == "1", page.text  # one live sandbox


def test_the_fleet_page_charts_the_start_history(
        dashboard: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    samples = [Sample(now - timedelta(minutes=m), grants=m, denials=m % 3,
                      penalties=int(m % 7 == 0), rate=60.0 - m / 2)
               for m in range(55, -1, -5)]  # oldest first
    monkeypatch.setattr(fleet, "read_history", lambda: {"fake": samples})
    page = dashboard.get("/fleet", headers=as_(READ)).text
    assert "bucket fake" in page and "<svg" in page
    assert f"granted {sum(s.grants for s in samples)} " in page
    assert "rate now 60.0/min" in page
    assert "unavailable" not in page


def test_the_fleet_page_lists_placement_policies_and_org_defaults(
        dashboard: TestClient) -> None:
    name = f"pl-{uuid.uuid4().hex[:6]}"
    placement.set_policy(placement.build(name, "local", template="tpl-1", canary="e2b:12.5",
                                         fallback="daytona,modal"), check_served=False)
    org = f"dash-{uuid.uuid4().hex[:6]}"
    placement.set_default(org, name)
    page = dashboard.get("/fleet", headers=as_(READ)).text
    assert (f"<tr><td>{name}</td><td>local</td><td>tpl-1</td><td>e2b:12.5</td>"
            "<td>daytona, modal</td></tr>") in page
    assert f'<td><a href="/runs?org={org}">{org}</a></td><td>{name}</td>' in page
    for provider in ("local", "e2b", "daytona", "modal"):  # each named provider has a row
        assert re.search(rf"<tr><td>{provider}</td><td>[^<]+</td><td>0</td>", page), page


def csrf_of(page: httpx.Response) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found, page.text
    return found.group(1)


def test_run_again_needs_the_write_token_and_a_fresh_confirmation(
        dashboard: TestClient, published: StubPublisher) -> None:
    run_id = submit()
    tasks.cancel_run(run_id)
    assert dashboard.get(f"/runs/{run_id}/again", headers=as_(READ)).status_code == 403
    confirm = dashboard.get(f"/runs/{run_id}/again", headers=as_(WRITE))
    assert confirm.status_code == 200
    token = csrf_of(confirm)
    forged = dashboard.post(f"/runs/{run_id}/again", data={"csrf": "x" + token},
                            headers=as_(WRITE))
    assert forged.status_code == 403
    again = dashboard.post(f"/runs/{run_id}/again", data={"csrf": token}, headers=as_(WRITE))
    assert again.status_code == 303
    new_id = again.headers["location"].rsplit("/", 1)[1]
    assert new_id != run_id and tasks.get_run(new_id).status == "queued"
    # The same confirmation posted twice is one new run, not two.
    twice = dashboard.post(f"/runs/{run_id}/again", data={"csrf": token}, headers=as_(WRITE))
    assert twice.headers["location"] == again.headers["location"]
    other = submit()
    stale = dashboard.post(f"/runs/{other}/again", data={"csrf": token}, headers=as_(WRITE))
    assert stale.status_code == 403
