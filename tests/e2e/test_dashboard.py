"""`playrun dashboard` in a real headless chromium, against a real worker and gateway.

The browser runs with page scripts disabled (the dashboard must work without them):
it signs in by typing the token and pressing Enter, reads the rendered DOM, and saves
screenshots to test-artifacts/ (gitignored).
"""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import tasks
from tasks.acquisition import capacity
from tasks.host.processes import die_with_parent, free_port, stop_group
from tests.support.cdp import Browser, Tab, chromium_path
from tests.support.env import GATEWAY_PORT
from tests.support.helpers import eventually, kinds
from tests.support.paths import PLAYS, ROOT
from tests.support.stack import Worker, worker_env

pytestmark = pytest.mark.slow
HELLO = ROOT / "examples" / "plays" / "hello.py"
ARTIFACTS = ROOT / "test-artifacts"
READ_TOKEN = "read-" + secrets.token_hex(16)
WRITE_TOKEN = "write-" + secrets.token_hex(16)
# A name a play writes into its progress events and output: it must stay text.
HOSTILE = '<img src=x onerror="alert(1)"><b>Ada</b>'


def _dashboard_env(**extra: str) -> dict[str, str]:
    return worker_env(PLAYRUN_DASHBOARD_TOKEN=READ_TOKEN,
                      PLAYRUN_DASHBOARD_WRITE_TOKEN=WRITE_TOKEN, **extra)


@pytest.fixture(scope="module")
def dashboard(worker: Worker) -> Iterator[str]:
    port = free_port()
    log_path = Path(tempfile.mktemp(prefix="playrun-dashboard-", suffix=".log"))
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tasks.cli.main", "dashboard"],
                                env=_dashboard_env(PLAYRUN_DASHBOARD_ADDR=f"127.0.0.1:{port}"),
                                cwd=str(ROOT), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=die_with_parent)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"dashboard exited: {log_path.read_text()}")
        try:
            return httpx.get(url + "/healthz", timeout=1).status_code == 200 \
                and b"dashboard ready" in log_path.read_bytes()
        except httpx.HTTPError:
            return False

    eventually(ready, timeout=30, what="the dashboard to listen")
    yield url
    stop_group(proc, 15)


@pytest.fixture(scope="module")
def runs(worker: Worker) -> dict[str, str]:
    org = f"dash-{uuid.uuid4().hex[:8]}"
    capacity.set_limit(org, 7)  # listed on the fleet page even with nothing running
    ok = tasks.submit_run(HELLO, input={"name": HOSTILE}, org_id=org)
    bad = tasks.submit_run(PLAYS / "raises.py", input={}, org_id=org)
    assert ok.wait(timeout=90).status == "succeeded"
    result = bad.wait(timeout=90)
    assert (result.status, result.code) == ("failed", "PLAY_ERROR")
    for handle in (ok, bad):
        eventually(lambda h=handle: "capacity.released" in kinds(h.id), what="release")
    return {"org": org, "ok": ok.id, "bad": bad.id}


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    binary = chromium_path()
    if binary is None:
        pytest.skip("Debian's chromium is not installed here (`apt-get install -y chromium`; "
                    ".ci/run installs it)")
    b = Browser(binary)
    yield b
    b.close()


def _signed_in(browser: Browser, url: str, token: str) -> Tab:
    tab = browser.tab()
    tab.disable_javascript()
    assert tab.open(url + "/runs") == 401
    assert "needs the dashboard token" in tab.dom()
    assert tab.open(url + "/login") == 200
    tab.type("input[name=token]", token)
    assert tab.press("form[action='/login'] button") == 200
    assert tab.url() == url + "/runs"
    return tab


def _shot(tab: Tab, name: str) -> None:
    data = tab.screenshot(ARTIFACTS / name)
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_requests_without_the_token_are_refused(dashboard: str) -> None:
    for path in ("/runs", "/fleet", f"/runs/{uuid.uuid4().hex}", "/"):
        answer = httpx.get(dashboard + path)
        assert answer.status_code == 401, path
        assert answer.headers["www-authenticate"].startswith("Bearer")
    wrong = {"Authorization": "Bearer " + READ_TOKEN[:-1] + "x"}
    assert httpx.get(dashboard + "/runs", headers=wrong).status_code == 401
    assert httpx.get(dashboard + "/runs", cookies={"playrun_dashboard": "forged"}
                     ).status_code == 401
    assert httpx.post(dashboard + "/login", data={"token": "nope"}).status_code == 401
    page = httpx.get(dashboard + "/runs", headers={"Authorization": "Bearer " + READ_TOKEN})
    assert page.status_code == 200
    assert "script-src" not in page.headers["content-security-policy"]  # default-src 'none'
    assert "default-src 'none'" in page.headers["content-security-policy"]
    read = {"Authorization": "Bearer " + READ_TOKEN}
    for query, status, code in [("/runs?status=nope", 400, "INPUT_INVALID"),
                                ("/runs?before=junk", 400, "INPUT_INVALID"),
                                ("/runs?since=yesterday", 400, "INPUT_INVALID"),
                                ("/runs/abc", 400, "INPUT_INVALID"),
                                (f"/runs/{uuid.uuid4().hex}", 404, "RUN_NOT_FOUND"),
                                ("/runs?run=" + uuid.uuid4().hex[:10], 404, "RUN_NOT_FOUND")]:
        answer = httpx.get(dashboard + query, headers=read)
        assert answer.status_code == status, query
        assert f"error {code}:" in answer.text, query


def test_the_runs_and_run_pages_show_runs_timeline_and_code(dashboard: str,
                                                            runs: dict[str, str],
                                                            browser: Browser) -> None:
    tab = _signed_in(browser, dashboard, READ_TOKEN)
    assert tab.open(f"{dashboard}/runs?org={runs['org']}") == 200
    html = tab.dom()
    assert runs["ok"] in html and runs["bad"] in html and "PLAY_ERROR" in html
    assert tab.count("table.runs tr.run") == 2
    assert tab.count('meta[http-equiv="refresh"]') == 1
    _shot(tab, "dashboard-runs.png")
    assert tab.open(f"{dashboard}/runs?org={runs['org']}&status=failed") == 200
    assert tab.count("table.runs tr.run") == 1 and runs["bad"] in tab.dom()
    # A prefix typed into "Go to run" lands on the run's page.
    tab.type("input[name=run]", runs["bad"][:16])
    assert tab.press("form.goto button") == 200
    assert tab.url() == f"{dashboard}/runs/{runs['bad']}"
    html = tab.dom()
    assert "PLAY_ERROR" in html and "the customer code broke" in html
    assert "failure class" in html and ">play<" in html.replace("<strong>", ">").replace(
        "</strong>", "<")
    timeline = re.findall(r'<span class="kind">([a-z._]+)</span>', html)
    # (a start may be deferred first when other tests filled the shared bucket)
    assert timeline[0] == "attempt.started"
    assert timeline.index("sandbox.requested") < timeline.index("sandbox.live") \
        < timeline.index("run.failed")
    assert "last heartbeat 20" in html  # an ended attempt: when it was last heard of
    assert tab.count("section.attempt") == 1 and tab.count("tr.event") >= 5
    assert tab.count("a.button") == 0  # no "Run again" for a read token
    _shot(tab, "dashboard-run.png")
    # What the play wrote is text, never markup.
    assert tab.open(f"{dashboard}/runs/{runs['ok']}") == 200
    assert tab.count("main img") == 0 and tab.count("main pre b") == 0
    assert "&lt;img src=x" in tab.dom()


def test_a_running_attempt_shows_its_heartbeat_health(dashboard: str, runs: dict[str, str],
                                                       browser: Browser) -> None:
    handle = tasks.submit_run(PLAYS / "sleepy.py", input={"seconds": 30}, org_id=runs["org"])
    try:
        eventually(lambda: "run.progress" in kinds(handle.id), timeout=60, what="the play")
        tab = _signed_in(browser, dashboard, READ_TOKEN)
        assert tab.open(f"{dashboard}/runs/{handle.id}") == 200
        html = tab.dom()
        seen = re.search(r'heartbeat: last seen <strong class="seen">(\d+) s ago</strong>', html)
        assert seen and int(seen.group(1)) < 60
        assert ">healthy</span>" in html and "badge active" in html
        assert "counts as lost after 20" in html
    finally:
        tasks.cancel_run(handle.id)
    assert handle.wait(timeout=60).status == "cancelled"


def test_the_fleet_page_draws_the_start_rate_chart(dashboard: str, runs: dict[str, str],
                                                   browser: Browser) -> None:
    tab = _signed_in(browser, dashboard, READ_TOKEN)
    row = rf"<tr><td><a [^>]*>{runs['org']}</a></td><td>0</td><td>0</td><td>7</td>"

    def idle_row() -> bool:
        # A run of the org cancelled just before gives its lease back after its terminal.
        assert tab.open(dashboard + "/fleet") == 200
        return re.search(row, tab.dom()) is not None

    eventually(idle_row, timeout=30,
               what="capacity per org: the org with its limit 7, nothing live or reserved")
    assert tab.count("svg.chart") >= 1
    assert tab.count("svg.chart rect.grants") >= 1  # this session's starts, per minute
    assert tab.count("svg.chart circle.rate") >= 1
    _shot(tab, "dashboard-fleet.png")


def test_a_read_token_cannot_run_again_and_a_write_token_can(dashboard: str,
                                                             runs: dict[str, str],
                                                             browser: Browser) -> None:
    old = runs["ok"]
    read = {"Authorization": "Bearer " + READ_TOKEN}
    write = {"Authorization": "Bearer " + WRITE_TOKEN}
    assert httpx.get(f"{dashboard}/runs/{old}/again", headers=read).status_code == 403
    assert httpx.post(f"{dashboard}/runs/{old}/again", headers=read,
                      data={"csrf": "x"}).status_code == 403
    assert httpx.post(f"{dashboard}/runs/{old}/again", headers=write,
                      data={"csrf": "x"}).status_code == 403  # no confirmation
    before = {v.id for v in tasks.list_runs(50, runs["org"])}

    tab = _signed_in(browser, dashboard, WRITE_TOKEN)
    assert tab.open(f"{dashboard}/runs/{old}") == 200
    assert tab.count("a.button") == 1
    assert tab.open(f"{dashboard}/runs/{old}/again") == 200
    assert "Run again?" in tab.dom()
    _shot(tab, "dashboard-again.png")
    assert tab.press("form[action$='/again'] button") == 200
    new = tab.url().rsplit("/", 1)[-1]
    assert new != old and len(new) == 32 and new not in before
    result = tasks.RunHandle(new).wait(timeout=90)
    assert result.status == "succeeded"
    assert result.output == {"greeting": f"Hello, {HOSTILE}!", "shout": HOSTILE.upper()}
    admitted = tasks.run_events(new)[0]
    assert admitted.kind == "run.admitted" and admitted.data["again_of"] == old
    assert {v.id for v in tasks.list_runs(50, runs["org"])} - before == {new}

    # One confirmation, posted twice (a double click, a resend): one new run.
    page = httpx.get(f"{dashboard}/runs/{old}/again", headers=write).text
    csrf = re.search(r'name="csrf" value="([^"]+)"', page)
    assert csrf is not None
    first = httpx.post(f"{dashboard}/runs/{old}/again", headers=write,
                       data={"csrf": csrf.group(1)})
    second = httpx.post(f"{dashboard}/runs/{old}/again", headers=write,
                        data={"csrf": csrf.group(1)})
    assert first.status_code == second.status_code == 303
    assert first.headers["location"] == second.headers["location"]
    # ... and a confirmation made for one run does not start another.
    other = httpx.post(f"{dashboard}/runs/{runs['bad']}/again", headers=write,
                       data={"csrf": csrf.group(1)})
    assert other.status_code == 403
    tasks.RunHandle(first.headers["location"].rsplit("/", 1)[-1]).wait(timeout=90)


@pytest.mark.parametrize(("extra", "message"), [
    ({"PLAYRUN_DASHBOARD_TOKEN": ""}, "PLAYRUN_DASHBOARD_TOKEN is not set"),
    ({"PLAYRUN_DASHBOARD_ADDR": f"127.0.0.1:{GATEWAY_PORT}"}, "is the gateway's"),
    ({"PLAYRUN_DASHBOARD_TOKEN": "short"}, "shorter than 16"),
    ({"PLAYRUN_DASHBOARD_WRITE_TOKEN": READ_TOKEN}, "must differ"),
])
def test_the_dashboard_refuses_to_start_unsafely(pg_url: str, extra: dict[str, str],
                                                 message: str) -> None:
    env = _dashboard_env(PLAYRUN_DASHBOARD_ADDR=f"127.0.0.1:{free_port()}")
    env.update(extra)
    if env.get("PLAYRUN_DASHBOARD_TOKEN") == "":
        del env["PLAYRUN_DASHBOARD_TOKEN"]
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "tasks.cli.main", "dashboard"], env=env,
                          cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error CONFIG_INVALID:") and message in proc.stderr
    assert "Traceback" not in proc.stderr and time.monotonic() - began < 30


def test_on_sqlite_without_a_token_it_makes_one_and_prints_it(sqlite_db: str) -> None:
    port = free_port()
    env = worker_env(PLAYRUN_DATABASE_URL=sqlite_db, PLAYRUN_DASHBOARD_ADDR=f"127.0.0.1:{port}")
    proc = subprocess.Popen([sys.executable, "-m", "tasks.cli.main", "dashboard"], env=env,
                            cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, preexec_fn=die_with_parent)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        found = re.search(r"ready on http://127\.0\.0\.1:(\d+) \(token for this process: "
                          r"([A-Za-z0-9_-]{24,})\)", line)
        assert found and int(found.group(1)) == port, line
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(url + "/runs").status_code == 401
        page = httpx.get(url + "/runs", headers={"Authorization": "Bearer " + found.group(2)})
        assert page.status_code == 200 and "No runs match." in page.text
    finally:
        stop_group(proc, 15)
