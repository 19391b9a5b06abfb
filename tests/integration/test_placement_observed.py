"""What an operator sees of placement across two providers (the daytona double beside
`local`, a real worker with beat): Prometheus series labelled by provider on the worker's
and beat's endpoints, and the dashboard's fleet page over HTTP."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

import tasks
from tasks.constants import EventKind
from tasks.host.processes import free_port
from tasks.testing import Cli
from tests.support.helpers import eventually, kinds
from tests.support.metrics import endpoint, scrape
from tests.support.paths import HELLO, PLAYS
from tests.support.placement import CLOUD, cli_run, fleet, org, set_policy
from tests.support.stack import Worker

FOREVER = PLAYS / "forever.py"
READ = "read-" + secrets.token_hex(16)
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass
class Seen:
    worker: Worker
    beat_url: str
    worker_url: str
    cloud_policy: str  # daytona, local after it
    local_policy: str  # local, daytona after it; the default of `local_org`
    canary_policy: str
    local_org: str
    failed_over: str  # a run the double refused, served by local
    baseline: dict[str, float]  # live sandboxes by provider before the two long runs
    forever: list[str]  # one long run on each provider, live while the tests look


def labels(**kw: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(kw.items()))


def live_gauge(url: str, provider: str) -> float:
    return scrape(url).get(("playrun_provider_sandboxes_live", labels(provider=provider)), -1)


@pytest.fixture(scope="module")
def seen(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seen]:
    tmp = tmp_path_factory.mktemp("observed")
    metrics_dir = tmp / "metrics"
    with fleet(tmp, f"{CLOUD},local", PLAYRUN_METRICS_DIR=str(metrics_dir)) as (double, w):
        cloud = set_policy("--provider", CLOUD, "--fallback", "local")
        local = set_policy("--provider", "local", "--fallback", CLOUD)
        canary = set_policy("--provider", "local", "--canary", f"{CLOUD}:25",
                            "--fallback", CLOUD, "--template", "tpl-a")
        local_org = org()
        assert cli_run("placement", "default", local_org, local).exit_code == 0
        double.push_back("capacity_unavailable")
        refused = tasks.submit_run(HELLO, input={"name": "r"}, org_id=org(), placement=cloud)
        assert refused.wait(timeout=120).status == "succeeded", w.output()[-3000:]
        on_cloud = tasks.submit_run(HELLO, input={"name": "c"}, org_id=org(), placement=cloud)
        assert on_cloud.wait(timeout=120).status == "succeeded", w.output()[-3000:]
        for h in (refused, on_cloud):
            eventually(lambda h=h: EventKind.CAPACITY_RELEASED in kinds(h.id), what="release")
        beat_url = eventually(lambda: next(iter(metrics_dir.glob("beat-*.url")), None),
                              what="beat's metrics URL").read_text().strip()
        baseline = {p: live_gauge(beat_url, p) for p in (CLOUD, "local")}
        assert min(baseline.values()) >= 0, scrape(beat_url)  # both series exist at rest
        long_runs = [tasks.submit_run(FOREVER, input={}, org_id=org(), placement=cloud).id,
                     tasks.submit_run(FOREVER, input={}, org_id=local_org).id]
        for run_id in long_runs:
            eventually(lambda r=run_id: EventKind.SANDBOX_LIVE in kinds(r), timeout=90,
                       what="the long run's sandbox live")
        try:
            yield Seen(w, beat_url, endpoint(w.env, "worker", w.proc), cloud, local, canary,
                       local_org, refused.id, baseline, long_runs)
        finally:
            for run_id in long_runs:
                tasks.cancel_run(run_id)
            for run_id in long_runs:
                tasks.RunHandle(run_id).wait(timeout=60)
            eventually(lambda: double.live_count() == 0, what="the double's sandboxes deleted")


def test_a_scrape_shows_starts_failovers_and_live_sandboxes_by_provider(seen: Seen) -> None:
    for provider in (CLOUD, "local"):  # one long run live on each
        eventually(lambda p=provider: live_gauge(seen.beat_url, p) == seen.baseline[p] + 1,
                   what=f"the live gauge of {provider}")
    worker = scrape(seen.worker_url)
    expected = {
        # The refused create, then one create that made each run's sandbox.
        ("playrun_provider_creates_total",
         labels(provider=CLOUD, result="capacity_unavailable")): 1.0,
        ("playrun_provider_creates_total", labels(provider=CLOUD, result="ok")): 2.0,
        ("playrun_provider_creates_total", labels(provider="local", result="ok")): 2.0,
        ("playrun_placement_failovers_total",
         labels(provider=CLOUD, cause="capacity_unavailable")): 1.0,
    }
    assert {k: worker.get(k) for k in expected} == expected, worker
    placed = {k[1]: v for k, v in worker.items() if k[0] == "playrun_placements_total"}
    # A start paced by the start rate is placed again: at least one placement each.
    assert placed.get(labels(provider=CLOUD, reason="primary"), 0) >= 3, placed
    assert placed.get(labels(provider="local", reason="fallback"), 0) >= 1, placed
    assert placed.get(labels(provider="local", reason="primary"), 0) >= 1, placed
    rates = {dict(k[1])["bucket"] for k in scrape(seen.beat_url)
             if k[0] == "playrun_start_rate_per_second"}
    assert rates == {CLOUD, "local"}  # each served provider's own bucket


@pytest.fixture(scope="module")
def dashboard(seen: Seen, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    env = {**seen.worker.env, "PLAYRUN_DASHBOARD_TOKEN": READ,
           "PLAYRUN_DASHBOARD_ADDR": f"127.0.0.1:{port}"}
    proc = Cli("dashboard", ("dashboard",), env,
               tmp_path_factory.mktemp("dash") / "dashboard.log",
               ready_text="dashboard ready").start()
    try:
        proc.wait_ready(60)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.stop()


def row(page: str, provider: str) -> list[str]:
    """The cells of a provider's row in the providers table."""
    table = page.split('<table class="providers">', 1)[1].split("</table>", 1)[0]
    start = table.index(f"<tr><td>{provider}</td>")
    cells = table[start:table.index("</tr>", start)].removeprefix("<tr>")
    return [c.removeprefix("<td>").removesuffix("</td>") for c in cells.split("</td><td>")]


def test_the_fleet_page_shows_policies_defaults_and_each_providers_placements(
        seen: Seen, dashboard: str) -> None:
    page = httpx.get(dashboard + "/fleet", headers={"Authorization": f"Bearer {READ}"},
                     timeout=30)
    assert page.status_code == 200
    text = page.text
    assert (f"<tr><td>{seen.cloud_policy}</td><td>{CLOUD}</td><td>-</td><td>-</td>"
            "<td>local</td></tr>") in text
    assert (f"<tr><td>{seen.canary_policy}</td><td>local</td><td>tpl-a</td>"
            f"<td>{CLOUD}:25</td><td>{CLOUD}</td></tr>") in text
    assert (f'<td><a href="/runs?org={seen.local_org}">{seen.local_org}</a></td>'
            f"<td>{seen.local_policy}</td>") in text
    cloud, local = row(text, CLOUD), row(text, "local")
    # provider, served, live, pool, circuit, recent placements
    assert cloud[1] == local[1] == "yes"
    assert int(cloud[2]) >= 1 and int(local[2]) >= 1
    assert cloud[3] == local[3] == "-"  # no PLAYRUN_PROVIDER_MAX_LIVE
    assert cloud[4] == local[4] == "closed"
    assert "primary" in cloud[5]
    assert "fallback after capacity_unavailable" in local[5] and "primary" in local[5]


def test_the_fleet_page_needs_the_token(dashboard: str) -> None:
    assert httpx.get(dashboard + "/fleet", timeout=30).status_code == 401
