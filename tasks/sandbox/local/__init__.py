"""The `local` provider: one directory and one supervised process tree per sandbox.

Stateless across processes: everything needed to poll or delete a sandbox (labels, limits,
the supervisor's pid and start time, the sandbox's PID namespace, the exit record, the
console log) lives in its control record `<root>/.control/<sandbox_id>/`, outside the
sandbox's directory, so a worker other than the one that started a sandbox can inspect and
remove it, and a play that deletes its own directory cannot make it unfindable.

Two isolation modes (`PLAYRUN_SANDBOX_ISOLATION`, see docs/design.md "Strict isolation"):
`strict` runs the command under bubblewrap (new user, mount, PID, IPC, UTS and network
namespaces; only the sandbox directory writable, at /sandbox; the gateway socket's
directory at /run/playrun); `process` runs it on the host filesystem in its own session
(and PID namespace where `unshare` works). `auto` is strict when a probe run works.

One behaviour per module: `provider` (the SandboxProvider operations), `isolation` (mode
and probe), `strict` (host layout, bwrap config), `config` (the supervisor's exec config),
`processes` (reaping, finding and killing), `records` (the control record), `limits`
(cgroup v2), `paths` (path safety). The process that runs in the sandbox is
tasks/sandbox/supervisor.py, with its siblings supervisor_*.py copied beside it.
"""

from tasks.sandbox.local.isolation import (
    Isolation,
    check_isolation,
    probe_strict,
    resolve_isolation,
)
from tasks.sandbox.local.limits import cgroup_base
from tasks.sandbox.local.processes import pid_namespace_command
from tasks.sandbox.local.provider import LocalProvider

__all__ = [
    "Isolation",
    "LocalProvider",
    "cgroup_base",
    "check_isolation",
    "pid_namespace_command",
    "probe_strict",
    "resolve_isolation",
]
