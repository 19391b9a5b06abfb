"""pytest-celery's Docker setup for playrun: its Redis broker and backend containers, a
PostgreSQL container, and a worker container built from the project's Dockerfile.

Every test here is marked `docker` and skipped, with the reason, where no engine answers.
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest
from pytest_celery import (
    CeleryBackendCluster,
    CeleryBrokerCluster,
    CeleryTestWorker,
    CeleryWorkerCluster,
    CeleryWorkerContainer,
    RedisTestBackend,
    RedisTestBroker,
)
from pytest_docker_tools import build, container, fxtr

from tests.support.paths import ROOT

PG = {"POSTGRES_USER": "playrun", "POSTGRES_PASSWORD": "playrun", "POSTGRES_DB": "playrun"}


def engine_problem() -> str | None:
    """Why this machine cannot run the suite, or None."""
    try:
        import docker

        docker.from_env(timeout=3).ping()
    except Exception as exc:  # no socket, no permission, engine down: all mean "skip"
        return (f"no Docker engine answers ({type(exc).__name__}); this suite builds the "
                f"project's Dockerfile and runs it beside pytest-celery's Redis containers")
    return None


class PlayrunWorkerContainer(CeleryWorkerContainer):
    """The project's image running what docker-compose.yml runs: migrate, gateway, worker.
    Docker's default seccomp profile refuses bubblewrap, so sandboxes use `process`."""

    @classmethod
    def command(cls, *args: Any, **kwargs: Any) -> list[str]:
        return ["sh", "-c", "until playrun db upgrade; do sleep 1; done; "
                "playrun gateway & exec celery -A tasks worker --loglevel=INFO -n playrun@%h"]

    @classmethod
    def worker_queue(cls) -> str:
        return "playrun"


playrun_worker_image = build(path=str(ROOT), tag="playrun/worker:pytest-celery")

playrun_postgres = container(
    image="postgres:16", environment=PG, ports={"5432/tcp": None},
    network="{default_pytest_celery_network.name}")


@pytest.fixture
def playrun_worker_env(celery_worker_cluster_config: dict[str, Any],
                       playrun_postgres: Any) -> dict[str, str]:
    """In the network: the broker container's URL (it carries results too) and PostgreSQL."""
    broker = celery_worker_cluster_config["celery_broker_cluster_config"]["urls"][0]
    return {
        "PLAYRUN_REDIS_URL": broker,
        "PLAYRUN_DATABASE_URL": f"postgresql+psycopg://playrun:playrun@{playrun_postgres.name}"
                                f":5432/playrun",
        "PLAYRUN_SECRET_KEY": secrets.token_hex(16),
        "PLAYRUN_SANDBOX_ISOLATION": "process",
    }


playrun_worker_container = container(
    image="{playrun_worker_image.id}",
    environment=fxtr("playrun_worker_env"),
    network="{default_pytest_celery_network.name}",
    wrapper_class=PlayrunWorkerContainer,
    timeout=180,
    command=PlayrunWorkerContainer.command(),
)


@pytest.fixture
def celery_worker_cluster(playrun_worker_container: PlayrunWorkerContainer,
                          celery_setup_app: Any) -> Any:
    worker = CeleryTestWorker(playrun_worker_container, app=celery_setup_app)
    cluster = CeleryWorkerCluster(worker)
    yield cluster
    cluster.teardown()


# playrun's broker is Redis (its Lua start-rate buckets need it): no RabbitMQ variant.
@pytest.fixture
def celery_broker_cluster(celery_redis_broker: RedisTestBroker) -> Any:
    cluster = CeleryBrokerCluster(celery_redis_broker)
    yield cluster
    cluster.teardown()


@pytest.fixture
def celery_backend_cluster(celery_redis_backend: RedisTestBackend) -> Any:
    cluster = CeleryBackendCluster(celery_redis_backend)
    yield cluster
    cluster.teardown()
