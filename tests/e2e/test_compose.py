"""docker-compose.yml, checked without an engine: Debian's `docker-compose config` accepts
it (with .env.example's values), and the stack is shaped as the README says."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.paths import ROOT

COMPOSE = ROOT / "docker-compose.yml"
EXAMPLE_ENV = ROOT / ".env.example"
SERVICES = {"postgres", "redis", "migrate", "worker", "beat", "gateway", "flower", "dashboard"}
# The processes that reach the database through PgBouncer when .env says so.
POOLED = {"worker", "beat", "gateway", "flower", "dashboard"}
STARTED_AFTER_MIGRATE = {"worker", "beat", "gateway", "flower", "dashboard"}
# The metrics each process kind serves, as the settings name them (tasks/settings.py).
METRICS = {"worker": "PLAYRUN_METRICS_WORKER_ADDR", "beat": "PLAYRUN_METRICS_BEAT_ADDR",
           "gateway": "PLAYRUN_METRICS_GATEWAY_ADDR"}


def compose(*args: str, env_file: Path = EXAMPLE_ENV) -> subprocess.CompletedProcess[str]:
    if shutil.which("docker-compose") is None:
        pytest.skip("Debian's docker-compose is not installed (.ci/run installs it)")
    # The shell's variables win over the env file: give it none that the file sets.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PLAYRUN_", "POSTGRES_", "REDIS_", "FLOWER_"))}
    return subprocess.run(["docker-compose", "--env-file", str(env_file), "-f", str(COMPOSE),
                           "--profile", "metrics", "--profile", "pgbouncer", *args],
                          cwd=str(ROOT), env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def resolved() -> dict[str, Any]:
    """The file as docker-compose reads it: anchors merged, .env.example interpolated."""
    proc = compose("config")
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = yaml.safe_load(proc.stdout)
    return doc


def test_docker_compose_accepts_the_file() -> None:
    proc = compose("config", "-q")
    assert proc.returncode == 0, proc.stderr


def test_a_missing_secret_is_refused_by_name(tmp_path: Path) -> None:
    lines = [line for line in EXAMPLE_ENV.read_text().splitlines()
             if not line.startswith("PLAYRUN_SECRET_KEY=")]
    (tmp_path / "partial.env").write_text("\n".join(lines) + "\n")
    proc = compose("config", "-q", env_file=tmp_path / "partial.env")
    assert proc.returncode != 0 and "set PLAYRUN_SECRET_KEY in .env" in proc.stderr


def test_the_whole_stack_starts_after_the_migration(resolved: dict[str, Any]) -> None:
    services = resolved["services"]
    assert set(services) >= SERVICES
    migrate = services["migrate"]
    assert migrate["command"] == ["playrun", "db", "upgrade"] and migrate["restart"] == "no"
    assert {k: v["condition"] for k, v in migrate["depends_on"].items()} == {
        "postgres": "service_healthy", "redis": "service_healthy"}
    for name in STARTED_AFTER_MIGRATE:
        assert services[name]["depends_on"]["migrate"]["condition"] == \
            "service_completed_successfully", name


def test_restart_policies_health_checks_and_loopback_ports(resolved: dict[str, Any]) -> None:
    services = resolved["services"]
    for name, service in services.items():
        if name != "migrate":
            assert service["restart"] == "unless-stopped", name
        for port in service.get("ports", []):
            host_ip = port["host_ip"] if isinstance(port, dict) else str(port).split(":")[0]
            assert host_ip == "127.0.0.1", (name, port)
    for name in SERVICES - {"migrate", "beat"}:  # beat has no endpoint of its own
        assert services[name]["healthcheck"]["test"], name


def test_the_gateway_serves_with_several_processes(resolved: dict[str, Any]) -> None:
    command = resolved["services"]["gateway"]["command"]
    assert command[:2] == ["playrun", "gateway"]
    assert int(command[command.index("--workers") + 1]) >= 2


def test_secrets_come_from_the_env_file_only(resolved: dict[str, Any]) -> None:
    raw = COMPOSE.read_text()
    example = dict(line.split("=", 1) for line in EXAMPLE_ENV.read_text().splitlines()
                   if line and not line.startswith("#"))
    for key, value in example.items():
        if value:
            assert value not in raw, key  # only ${KEY} references in the file
    env = resolved["services"]["worker"]["environment"]
    assert env["PLAYRUN_SECRET_KEY"] == example["PLAYRUN_SECRET_KEY"]
    assert f":{example['POSTGRES_PASSWORD']}@postgres:" in env["PLAYRUN_DATABASE_URL"]
    assert resolved["services"]["flower"]["environment"]["FLOWER_BASIC_AUTH"] == \
        example["FLOWER_BASIC_AUTH"]
    assert ".env" in (ROOT / ".gitignore").read_text().split()


def test_prometheus_scrapes_each_process_kind_where_it_serves(resolved: dict[str, Any]) -> None:
    config = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    targets = {}
    for job in config["scrape_configs"]:
        for static in job.get("static_configs", []):
            targets.update({t.split(":")[0]: int(t.split(":")[1]) for t in static["targets"]})
        for dns in job.get("dns_sd_configs", []):
            targets.update({n: int(dns["port"]) for n in dns["names"]})
    services = resolved["services"]
    for kind, setting in METRICS.items():
        served = services[kind]["environment"][setting]
        assert served == f"0.0.0.0:{targets[kind]}", (kind, served, targets)
        assert services[kind]["environment"]["PLAYRUN_METRICS_ENABLED"] == "1"
    volumes = services["prometheus"]["volumes"]
    assert any(str(v.get("source", v)).endswith("deploy/prometheus.yml")
               if isinstance(v, dict) else "deploy/prometheus.yml" in v for v in volumes)


def test_postgres_is_reached_directly_unless_env_names_pgbouncer(
        resolved: dict[str, Any], tmp_path: Path) -> None:
    services = resolved["services"]
    for name in POOLED | {"migrate"}:
        env = services[name]["environment"]
        assert "@postgres:5432/playrun" in env["PLAYRUN_DATABASE_URL"], name
        assert env["PLAYRUN_DB_PGBOUNCER"] == "false", name
    bouncer = services["pgbouncer"]
    assert bouncer["profiles"] == ["pgbouncer"]
    assert bouncer["build"]["context"].endswith("deploy/pgbouncer")
    assert bouncer["depends_on"]["postgres"]["condition"] == "service_healthy"
    # .env.example's three commented lines, uncommented: every process but migrate pools.
    pooled_env = tmp_path / "pooled.env"
    pooled_env.write_text(EXAMPLE_ENV.read_text().replace("# PLAYRUN_DB_", "PLAYRUN_DB_"))
    proc = compose("config", env_file=pooled_env)
    assert proc.returncode == 0, proc.stderr
    pooled = yaml.safe_load(proc.stdout)["services"]
    for name in POOLED:
        env = pooled[name]["environment"]
        assert "@pgbouncer:6432/playrun" in env["PLAYRUN_DATABASE_URL"], name
        assert env["PLAYRUN_DB_PGBOUNCER"] == "true", name
    migrate = pooled["migrate"]["environment"]
    assert "@postgres:5432/playrun" in migrate["PLAYRUN_DATABASE_URL"]
    assert migrate["PLAYRUN_DB_PGBOUNCER"] == "false"
