"""The fault kinds, one class each. A kind may bring its own servers (a private Redis or
PostgreSQL it can restart, proxies the stack's URLs point through, a tmpfs for the
sandbox root) and injects its fault while the load runs; inject returns the monotonic
time the fault ended (None: it lasts the whole run, so there is nothing to recover from).
"""

from __future__ import annotations

import os
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from bench.chaoslib import partition
from bench.chaoslib.harness import Stack
from bench.chaoslib.partition import Partition
from bench.chaoslib.proxy import Mode, Proxy
from bench.chaoslib.services import PrivatePostgres, PrivateRedis, Tmpfs, pg_bin
from bench.common import PG_BASE

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
SKEW = "+5m"


@dataclass
class Setup:
    pg_base: str | None = None
    redis_base: str | None = None
    redis_db: int = 0


class Fault:
    name = ""
    describe = ""

    def skip_reason(self) -> str | None:
        return None

    def setup(self, es: ExitStack, log_dir: Path) -> Setup:
        """Before the database exists (a private server must be up to create it). Every
        kind has a private Redis: the shared one's bench db numbers are shared by all
        benches, and bench_env flushes its db."""
        self.redis = PrivateRedis(log_dir)
        es.callback(self.redis.stop)
        return Setup(redis_base=self.redis.url)

    def prepare(self, es: ExitStack, env: dict[str, str]) -> None:
        """After the database exists, before the stack starts."""

    def stack_urls(self) -> dict[str, str]:
        """PLAYRUN_* overrides for the stack's processes only (not the suite's own)."""
        return {}

    def after_start(self, stack: Stack, env: dict[str, str]) -> None:
        """Once the stack is up, before the load."""

    def inject(self, stack: Stack, fault_s: float) -> float | None:
        raise NotImplementedError


class WorkerKill(Fault):
    name = "worker SIGKILL"
    describe = "4 SIGKILLs of a whole worker group, alternating, each restarted at once"

    def inject(self, stack: Stack, fault_s: float) -> float | None:
        workers = stack.workers
        assert workers is not None
        kills, target, last = 4, 0, time.monotonic()
        for k in range(kills):
            workers.wait_ready(target)  # a worker still starting is not killed again
            workers.kill(target, "group")
            last = time.monotonic()
            target = 1 - target
            if k < kills - 1:
                time.sleep(fault_s / kills)
        return last


class GatewayRestart(Fault):
    name = "gateway restart"
    describe = "kill -9 of `playrun gateway`, started again at once"

    def inject(self, stack: Stack, fault_s: float) -> float | None:
        assert stack.gateway is not None
        stack.restart(stack.gateway)
        return time.monotonic()


class RedisRestart(Fault):
    name = "Redis restart"
    describe = "kill -9 of the stack's redis-server (no persistence: every key lost), 2 s down"

    def inject(self, stack: Stack, fault_s: float) -> float | None:
        self.redis.kill()
        time.sleep(2.0)
        self.redis.start()
        return time.monotonic()


class RabbitMQRestart(Fault):
    name = "RabbitMQ restart"
    describe = ("the broker on RabbitMQ (quorum queues, a vhost of the suite's own): "
                "`rabbitmqctl stop_app`, 2 s down, `start_app`")

    def skip_reason(self) -> str | None:
        from tasks.testing import rabbitmq

        return rabbitmq.unavailable()

    def setup(self, es: ExitStack, log_dir: Path) -> Setup:
        from tasks.testing import rabbitmq

        setup = super().setup(es, log_dir)
        rabbitmq.drop_orphaned_vhosts()
        vhost = rabbitmq.create_vhost()
        es.callback(rabbitmq.ctl, "delete_vhost", vhost)
        # Whatever happens in the load, this machine's broker is left running.
        es.callback(rabbitmq.ensure_running)
        self.url = rabbitmq.url(vhost)
        return setup

    def prepare(self, es: ExitStack, env: dict[str, str]) -> None:
        """The suite's own submits publish to RabbitMQ too."""
        from tasks.broker.app import app
        from tasks.broker.config import rebind
        from tasks.settings import get_settings, reset_settings

        os.environ["PLAYRUN_BROKER_URL"] = env["PLAYRUN_BROKER_URL"] = self.url
        reset_settings()
        rebind(app, get_settings())

    def stack_urls(self) -> dict[str, str]:
        return {"PLAYRUN_BROKER_URL": self.url}

    def inject(self, stack: Stack, fault_s: float) -> float | None:
        from tasks.testing import rabbitmq

        return rabbitmq.restart_app(down_s=2.0)


class PostgresRestart(Fault):
    name = "PostgreSQL restart"
    describe = "`pg_ctl stop -m immediate` of a private cluster, 2 s down, started again"

    def skip_reason(self) -> str | None:
        return None if pg_bin() else "no PostgreSQL binaries in /usr/lib/postgresql/*/bin"

    def setup(self, es: ExitStack, log_dir: Path) -> Setup:
        bindir = pg_bin()
        assert bindir is not None
        setup = super().setup(es, log_dir)
        self.pg = PrivatePostgres(bindir)
        es.callback(self.pg.stop)
        setup.pg_base = self.pg.url
        return setup

    def inject(self, stack: Stack, fault_s: float) -> float | None:
        self.pg.kill()
        time.sleep(2.0)
        self.pg.start()
        return time.monotonic()


def _hostport(url: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or default_port


class Network(Fault):
    """The stack (gateway, beat, workers) reaches PostgreSQL and Redis through proxies;
    the suite itself (submitting, checking) does not."""

    mode = Mode.PASS
    delay_ms = 0.0

    def setup(self, es: ExitStack, log_dir: Path) -> Setup:
        setup = super().setup(es, log_dir)
        self.proxies = [Proxy(*_hostport(PG_BASE, 5432)), Proxy("127.0.0.1", self.redis.port)]
        for proxy in self.proxies:
            es.callback(proxy.close)
        return setup

    def prepare(self, es: ExitStack, env: dict[str, str]) -> None:
        pg, rd = (p.port for p in self.proxies)
        db = env["PLAYRUN_DATABASE_URL"]
        redis_url = env["PLAYRUN_REDIS_URL"]
        self.urls = {
            "PLAYRUN_DATABASE_URL": db.replace(f":{_hostport(db, 5432)[1]}/", f":{pg}/"),
            "PLAYRUN_REDIS_URL": redis_url.replace(f":{_hostport(redis_url, 6379)[1]}/",
                                                   f":{rd}/"),
        }

    def stack_urls(self) -> dict[str, str]:
        return self.urls

    def inject(self, stack: Stack, fault_s: float) -> float | None:
        for proxy in self.proxies:
            proxy.set_mode(self.mode, self.delay_ms)
        time.sleep(fault_s)
        for proxy in self.proxies:
            proxy.set_mode(Mode.PASS)
        return time.monotonic()


class NetDelay(Network):
    name = "network slow"
    describe = "200 ms added to every chunk to PostgreSQL and Redis for the fault window"
    mode, delay_ms = Mode.DELAY, 200.0


class NetDrop(Network):
    name = "network cut"
    describe = "every connection to PostgreSQL and Redis reset, new ones refused, then healed"
    mode = Mode.DROP


class NetBlackhole(Network):
    name = "network black-hole"
    describe = "nothing forwarded or answered for the window, then every connection reset"
    mode = Mode.BLACKHOLE


class NetPartition(Network):
    name = "network partition"
    describe = ("packets to PostgreSQL and Redis dropped for the window (iptables); then "
                "every connection open at its end stays silent for good, new ones pass")

    def skip_reason(self) -> str | None:
        return partition.skip_reason()

    def setup(self, es: ExitStack, log_dir: Path) -> Setup:
        setup = super().setup(es, log_dir)
        self.cuts = [Partition(proxy.port) for proxy in self.proxies]
        for cut in self.cuts:
            es.callback(cut.clear)  # before the proxies close: callbacks run in reverse
        return setup

    def inject(self, stack: Stack, fault_s: float) -> float | None:
        for cut in self.cuts:
            cut.cut()
        time.sleep(fault_s)
        dead = sum(cut.heal(keep_dead=True) for cut in self.cuts)
        print(f"network partition: {dead} connections left silent for good", flush=True)
        return time.monotonic()


class ClockSkew(Fault):
    name = "clock skew"
    describe = f"worker w1 (and the runners it launches) under libfaketime, clock {SKEW}"

    def skip_reason(self) -> str | None:
        if not LIBFAKETIME.exists():
            return f"no {LIBFAKETIME} (apt-get install faketime)"
        return None

    def after_start(self, stack: Stack, env: dict[str, str]) -> None:
        stack.restart_worker(1, {**env, "LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": SKEW})

    def inject(self, stack: Stack, fault_s: float) -> float | None:
        return None  # skewed for the whole load: there is no end to recover from


class DiskFull(Fault):
    name = "sandbox disk full"
    describe = "the sandbox root on a 64 MB tmpfs, filled to ENOSPC for the window, then freed"

    def skip_reason(self) -> str | None:
        return None if os.geteuid() == 0 else "not root: cannot mount a tmpfs"

    def prepare(self, es: ExitStack, env: dict[str, str]) -> None:
        self.tmpfs = Tmpfs(Path(env["PLAYRUN_SANDBOX_ROOT"]), 64)
        es.callback(self.tmpfs.unmount)

    def inject(self, stack: Stack, fault_s: float) -> float | None:
        self.tmpfs.fill()
        time.sleep(fault_s)
        self.tmpfs.free()
        return time.monotonic()


KINDS: dict[str, type[Fault]] = {
    "worker-kill": WorkerKill,
    "gateway": GatewayRestart,
    "redis": RedisRestart,
    "rabbitmq": RabbitMQRestart,
    "net-slow": NetDelay,
    "net-cut": NetDrop,
    "net-blackhole": NetBlackhole,
    "net-partition": NetPartition,
    "postgres": PostgresRestart,
    "clock-skew": ClockSkew,
    "disk-full": DiskFull,
}
