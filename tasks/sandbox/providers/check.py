"""`playrun providers check`: what a user runs before going live on a provider.

Each step is timed and stops the check with a coded error: credentials, a listing
(reachability and auth), a create, the sandbox's python, a call from inside the sandbox
to the gateway's public URL, and the delete (which runs whatever failed before it).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from tasks.constants import LABEL_FLEET, LABEL_MANAGED
from tasks.errors import PlayrunError
from tasks.sandbox.base import ProviderError, SandboxProvider, SandboxSpec
from tasks.settings import Settings

CHECK_LABEL = "playrun.check"
# Runs inside the sandbox: its python, and whether it reaches the gateway's health check.
PROBE = b"""import json, sys, urllib.request
doc = {"python": sys.version.split()[0]}
try:
    with urllib.request.urlopen(sys.argv[1].rstrip("/") + "/healthz", timeout=10) as r:
        doc["healthz"] = r.status
except Exception as exc:
    doc["healthz_error"] = str(exc)[:300]
open("check.json", "w").write(json.dumps(doc))
"""
STEP_TIMEOUT_S = 120.0


class CheckFailedError(PlayrunError):
    """A step of the provider check failed."""

    code = "PROVIDER_CHECK_FAILED"


@dataclass
class Step:
    name: str
    seconds: float
    ok: bool
    detail: str = ""
    code: str = ""


@dataclass
class Report:
    provider: str
    steps: list[Step] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(step.ok for step in self.steps)


class _Stop(Exception):
    pass


@contextmanager
def _step(report: Report, name: str) -> Iterator[list[str]]:
    detail: list[str] = []
    started = time.monotonic()
    try:
        yield detail
    except PlayrunError as exc:
        report.steps.append(Step(name, time.monotonic() - started, False, exc.message, exc.code))
        raise _Stop from exc
    except Exception as exc:
        report.steps.append(Step(name, time.monotonic() - started, False, str(exc)[:300],
                                 ProviderError.code))
        raise _Stop from exc
    report.steps.append(Step(name, time.monotonic() - started, True, " ".join(detail)))


def run_check(settings: Settings, load: Callable[[], SandboxProvider]) -> Report:
    report = Report(settings.sandbox_provider)
    sandbox_id: str | None = None
    provider: SandboxProvider | None = None
    try:
        with _step(report, "credentials") as detail:
            provider = load()
            detail.append(f"{provider.name} SDK loaded")
        with _step(report, "list") as detail:
            found = provider.list({LABEL_MANAGED: "1", LABEL_FLEET: settings.fleet})
            detail.append(f"{len(found)} sandboxes of fleet {settings.fleet!r}")
        with _step(report, "create") as detail:
            ref = provider.create(SandboxSpec(
                labels={LABEL_MANAGED: "1", LABEL_FLEET: settings.fleet, CHECK_LABEL: "1"},
                files={"probe.py": PROBE}, key=f"pr-check-{secrets.token_hex(6)}",
                lifetime_s=600.0))
            sandbox_id = ref.sandbox_id
            detail.append(sandbox_id)
        with _step(report, "python and gateway from inside") as detail:
            detail.extend(_probe(provider, sandbox_id, settings.runner_gateway_url()))
    except _Stop:
        pass
    finally:
        if provider is not None and sandbox_id is not None:
            try:
                with _step(report, "delete") as detail:
                    provider.delete(sandbox_id)
                    detail.append(sandbox_id)
            except _Stop:
                pass
    return report


def _probe(provider: SandboxProvider, sandbox_id: str, gateway_url: str) -> list[str]:
    provider.exec_detached(sandbox_id, ["{python}", "probe.py", gateway_url], env={},
                           timeout_s=60)
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while (status := provider.poll(sandbox_id)).state == "running":
        if time.monotonic() > deadline:
            raise CheckFailedError("the probe did not finish in time")
        time.sleep(0.2)
    found = provider.read_file(sandbox_id, "check.json", max_bytes=4096)
    if status.state != "exited" or found is None:
        raise CheckFailedError(f"the probe ended {status.state} "
                               f"(exit {status.exit_code}) without its answer")
    try:
        doc = json.loads(found.data)
    except ValueError:
        raise CheckFailedError("the probe's answer is not JSON") from None
    if not isinstance(doc, dict):
        raise CheckFailedError("the probe's answer is not an object")
    if doc.get("healthz") != 200:
        raise CheckFailedError(f"python {doc.get('python')} could not reach {gateway_url}"
                               f"/healthz: {doc.get('healthz_error') or doc.get('healthz')}")
    return [f"python {doc.get('python')}", f"GET {gateway_url}/healthz 200"]
