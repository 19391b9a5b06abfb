"""Code-interpreter sessions of the AgentCore double: a directory and real local processes.

A session's working directory is a directory under tmp: file tools resolve relative
paths there and commands run with it as their cwd, so the runner a boot script starts
calls the real gateway on loopback. Each process carries a marker variable, so the
session's processes are found again even after they left its process group (setsid).
"""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import signal
import string
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.doubles.agentcore_wire import ApiError, invalid

MARKER = "PLAYRUN_AGENTCORE_DOUBLE_SESSION"
COMMAND_TIMEOUT_S = 120.0
MAX_OUTPUT = 1 << 20
_ALNUM = string.ascii_letters + string.digits


def new_session_id() -> str:
    return "".join(secrets.choice(_ALNUM) for _ in range(26))


@dataclass
class Task:
    proc: subprocess.Popen[bytes]
    out: Path
    err: Path
    stopped: bool = False


@dataclass
class Session:
    session_id: str
    name: str
    token: str
    timeout_s: int
    created_at: float
    workdir: Path
    status: str = "READY"
    updated_at: float = 0.0
    tasks: dict[str, Task] = field(default_factory=dict)

    @property
    def expires_at(self) -> float:
        return self.created_at + self.timeout_s

    def summary(self, interpreter: str) -> dict[str, Any]:
        from tests.doubles.agentcore_wire import iso

        return {
            "codeInterpreterIdentifier": interpreter,
            "sessionId": self.session_id,
            "name": self.name,
            "status": self.status,
            "createdAt": iso(self.created_at),
            "lastUpdatedAt": iso(self.updated_at or self.created_at),
        }

    # --- processes -------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.workdir),
            "LANG": "C.UTF-8",
            MARKER: self.session_id,
        }

    def pids(self) -> set[int]:
        """Every live process of this session: by marker, or by a cwd inside it."""
        found: set[int] = set()
        marker = f"{MARKER}={self.session_id}".encode()
        root = str(self.workdir)
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                environ = Path(entry.path, "environ").read_bytes()
                cwd = os.readlink(Path(entry.path, "cwd"))
            except OSError:
                continue
            if marker in environ.split(b"\0") or cwd == root or cwd.startswith(root + "/"):
                found.add(int(entry.name))
        found.discard(os.getpid())
        return found

    def kill_all(self) -> None:
        for _ in range(5):  # a dying parent may have forked once more
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)
        for task in self.tasks.values():
            if task.proc.poll() is None:
                task.proc.wait(timeout=5)

    # --- tools ---------------------------------------------------------------------------

    def path(self, rel: object) -> Path:
        if not isinstance(rel, str) or not rel or rel.startswith("/"):
            raise invalid(f"path must be relative to the session's directory: {rel!r}")
        parts = Path(rel).parts
        if ".." in parts:
            raise invalid(f"path leaves the session's directory: {rel!r}")
        return self.workdir.joinpath(*parts)

    def invoke(self, name: str, args: dict[str, Any], scratch: Path) -> dict[str, Any]:
        handler = {
            "writeFiles": self._write_files,
            "readFiles": self._read_files,
            "listFiles": self._list_files,
            "removeFiles": self._remove_files,
            "executeCommand": self._execute_command,
            "startCommandExecution": lambda a: self._start_command(a, scratch),
            "getTask": self._get_task,
            "stopTask": self._stop_task,
        }.get(name)
        if handler is None:
            raise invalid(f"tool {name!r} is not offered by this double")
        return handler(args)

    def _write_files(self, args: dict[str, Any]) -> dict[str, Any]:
        content = args.get("content")
        if not isinstance(content, list) or not content:
            raise invalid("writeFiles needs content")
        for block in content:
            target = self.path(block.get("path"))
            target.parent.mkdir(parents=True, exist_ok=True)
            if "blob" in block:
                target.write_bytes(base64.b64decode(block["blob"]))
            else:
                target.write_text(block.get("text", ""))
        return _text(f"Successfully wrote all {len(content)} files")

    def _read_files(self, args: dict[str, Any]) -> dict[str, Any]:
        blocks = []
        for rel in args.get("paths") or []:
            target = self.path(rel)
            if not target.is_file():
                return _text(f"File not found: {rel}", error=True)
            data = target.read_bytes()
            resource: dict[str, Any] = {"uri": f"file:///{rel}"}
            try:
                resource.update(type="text", text=data.decode())
            except UnicodeDecodeError:
                resource.update(type="blob", blob=base64.b64encode(data).decode())
            blocks.append({"type": "resource", "resource": resource})
        return {"content": blocks, "isError": False}

    def _list_files(self, args: dict[str, Any]) -> dict[str, Any]:
        rel = args.get("directoryPath") or "."
        base = self.workdir if rel in (".", "") else self.path(rel)
        names = sorted(p.name for p in base.iterdir()) if base.is_dir() else []
        return {
            "content": [{"type": "resource_link", "name": n, "uri": f"file:///{n}"} for n in names],
            "isError": False,
        }

    def _remove_files(self, args: dict[str, Any]) -> dict[str, Any]:
        for rel in args.get("paths") or []:
            self.path(rel).unlink(missing_ok=True)
        return _text("Removed")

    def _execute_command(self, args: dict[str, Any]) -> dict[str, Any]:
        command = _command(args)
        began = time.monotonic()
        try:
            done = subprocess.run(
                ["sh", "-c", command],
                cwd=self.workdir,
                env=self.env(),
                capture_output=True,
                timeout=COMMAND_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return _text("Command timed out", error=True)
        out = done.stdout[:MAX_OUTPUT].decode("utf-8", "replace")
        err = done.stderr[:MAX_OUTPUT].decode("utf-8", "replace")
        result = _text(out or err, error=done.returncode != 0)
        result["structuredContent"] = {
            "stdout": out,
            "stderr": err,
            "exitCode": done.returncode,
            "executionTime": time.monotonic() - began,
        }
        return result

    def _start_command(self, args: dict[str, Any], scratch: Path) -> dict[str, Any]:
        command = _command(args)
        task_id = secrets.token_hex(8)
        out, err = scratch / f"{task_id}.out", scratch / f"{task_id}.err"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            proc = subprocess.Popen(
                ["sh", "-c", command],
                cwd=self.workdir,
                env=self.env(),
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
            )
        self.tasks[task_id] = Task(proc, out, err)
        result = _text(f"Task {task_id} started")
        result["structuredContent"] = {"taskId": task_id, "taskStatus": "working"}
        return result

    def _task(self, args: dict[str, Any]) -> tuple[str, Task]:
        task_id = args.get("taskId")
        task = self.tasks.get(task_id) if isinstance(task_id, str) else None
        if task is None:
            raise ApiError(404, "ResourceNotFoundException", f"task {task_id!r} not found")
        return str(task_id), task

    def _get_task(self, args: dict[str, Any]) -> dict[str, Any]:
        task_id, task = self._task(args)
        code = task.proc.poll()
        status = (
            "canceled"
            if task.stopped
            else "working"
            if code is None
            else "completed"
            if code == 0
            else "failed"
        )
        doc: dict[str, Any] = {
            "taskId": task_id,
            "taskStatus": status,
            "stdout": task.out.read_bytes()[:MAX_OUTPUT].decode("utf-8", "replace"),
            "stderr": task.err.read_bytes()[:MAX_OUTPUT].decode("utf-8", "replace"),
        }
        if code is not None:
            doc["exitCode"] = code
        result = _text(status)
        result["structuredContent"] = doc
        return result

    def _stop_task(self, args: dict[str, Any]) -> dict[str, Any]:
        task_id, task = self._task(args)
        if task.proc.poll() is None:
            task.stopped = True
            with contextlib.suppress(OSError):
                os.killpg(task.proc.pid, signal.SIGKILL)
            task.proc.wait(timeout=5)
        result = _text(f"Task {task_id} stopped")
        result["structuredContent"] = {"taskId": task_id, "taskStatus": "canceled"}
        return result


def _command(args: dict[str, Any]) -> str:
    command = args.get("command")
    if not isinstance(command, str) or not command:
        raise invalid("command is required")
    return command


def _text(text: str, *, error: bool = False) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": error}
