"""This machine's RabbitMQ for tests and the chaos suite, through rabbitmqctl: a vhost of
one process's own (given to guest, deleted after), so parallel sessions never share a
queue; a vhost whose process died is deleted by the next one. Also a restart of the
broker application, and a policy that makes the broker refuse publishes to a queue."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import time
from urllib.parse import quote

from tasks.host.processes import pid_alive

HOST, PORT = "127.0.0.1", 5672
PREFIX = "playrun_test_"


def ctl(*args: str, timeout: float = 60.0) -> str:
    bare = ("--no-table-headers",) if args[0].startswith("list_") else ()
    done = subprocess.run(["rabbitmqctl", "-q", *bare, *args], capture_output=True, text=True,
                          timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {done.stderr.strip()[-500:]}")
    return done.stdout


def unavailable() -> str | None:
    """Why the RabbitMQ tests cannot run here, or None."""
    if shutil.which("rabbitmqctl") is None:
        return "no rabbitmqctl on PATH"
    try:
        socket.create_connection((HOST, PORT), timeout=2).close()
    except OSError as exc:
        return f"no RabbitMQ at {HOST}:{PORT}: {exc}"
    return None


def drop_orphaned_vhosts() -> None:
    for name in ctl("list_vhosts", "name").split():
        parts = name.split("_")
        if name.startswith(PREFIX) and len(parts) > 2 and parts[2].isdigit() \
                and not pid_alive(int(parts[2])):
            ctl("delete_vhost", name)


def create_vhost() -> str:
    name = f"{PREFIX}{os.getpid()}_{secrets.token_hex(3)}"
    ctl("add_vhost", name)
    ctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
    return name


def url(vhost: str) -> str:
    return f"amqp://guest:guest@{HOST}:{PORT}/{quote(vhost, safe='')}"


def queues(vhost: str) -> dict[str, tuple[str, int]]:
    """name -> (type, messages ready) of every queue in `vhost`."""
    out: dict[str, tuple[str, int]] = {}
    for line in ctl("list_queues", "-p", vhost, "name", "type", "messages_ready").splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2].isdigit():
            out[parts[0]] = (parts[1], int(parts[2]))
    return out


def restart_app(down_s: float = 2.0) -> float:
    """Stop the RabbitMQ application on this node and start it again (the Erlang node
    stays up; every connection is cut); returns the monotonic time it answers again."""
    ctl("stop_app")
    try:
        time.sleep(down_s)
    finally:
        ensure_running()
    return time.monotonic()


def ensure_running() -> None:
    """The broker application started (after a stop_app), or the whole node (after a
    crash), as this machine starts it; returns once it accepts connections."""
    if unavailable() is None:
        return
    try:
        ctl("start_app", timeout=120)
    except RuntimeError:  # the node itself is down
        subprocess.run(["rabbitmq-server", "-detached"], capture_output=True, timeout=60,
                       check=False)
    wait_up()


def wait_up(timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((HOST, PORT), timeout=2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


REFUSE = "playrun-test-refuse"


def refuse_publishes(vhost: str, queue: str) -> None:
    """Publishes to `queue` are nacked once it holds a message (a policy: length limit 0,
    reject-publish), as a broker that cannot take them; returns once the queue has it."""
    ctl("set_policy", "-p", vhost, "--apply-to", "queues", REFUSE, f"^{re.escape(queue)}$",
        json.dumps({"max-length": 0, "overflow": "reject-publish"}))
    deadline = time.monotonic() + 30
    while not any(line.split() == [queue, REFUSE]
                  for line in ctl("list_queues", "-p", vhost, "name", "policy").splitlines()):
        if time.monotonic() > deadline:
            raise AssertionError(f"policy {REFUSE} never reached {queue}")
        time.sleep(0.1)


def allow_publishes(vhost: str) -> None:
    ctl("clear_policy", "-p", vhost, REFUSE)
