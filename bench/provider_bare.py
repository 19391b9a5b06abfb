"""The baseline of bench_providers: each provider's own SDK, called directly, doing what a
user would to start the same runner in a fresh sandbox: create, upload its files (and its
environment), exec the boot script's start. No playrun adapter, database or broker.

Each `bare_<provider>(double, files, argv, env)` returns (sandbox id, delete callable);
the runner's start record is then read through playrun's adapter, untimed.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tasks.sandbox.providers import bootstrap

Started = tuple[str, Callable[[], None]]
WORKDIR = bootstrap.WORKDIR


def _start_command(workdir: str, argv: Sequence[str], env_file: str | None = None) -> str:
    return bootstrap.start_command(workdir, argv, timeout_s=60, env_file=env_file)


def bare_daytona(double: Any, files: Mapping[str, bytes], argv: Sequence[str],
                 env: Mapping[str, str]) -> Started:
    from daytona import CreateSandboxFromSnapshotParams, Daytona, DaytonaConfig, FileUpload

    client = _cached("daytona", lambda: _daytona_client(Daytona, DaytonaConfig, double.env))
    box = client.create(CreateSandboxFromSnapshotParams(
        labels={"bench": "1"}, language="python", ephemeral=True), timeout=60)
    # The environment rides along in the one upload (a file the boot script reads).
    every = {**files, bootstrap.ENV_FILE: bootstrap.env_json(env)}
    box.fs.upload_files([FileUpload(source=data, destination=f"{WORKDIR}/{name}")
                         for name, data in every.items()], timeout=30)
    answer = box.process.exec(
        f"sh -c {shlex.quote(_start_command(WORKDIR, argv, bootstrap.ENV_FILE))}", timeout=30)
    assert answer.exit_code == 0, answer.result
    return box.id, lambda: box.delete(timeout=30)


def _daytona_client(daytona: Any, config: Any, env: Mapping[str, str]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return daytona(config(api_url=env["DAYTONA_API_URL"], api_key=env["DAYTONA_API_KEY"],
                              use_deprecated_polling=True))


def bare_e2b(double: Any, files: Mapping[str, bytes], argv: Sequence[str],
             env: Mapping[str, str]) -> Started:
    from e2b import Sandbox

    params = {"api_key": double.env["E2B_API_KEY"], "api_url": double.url,
              "sandbox_url": double.url, "domain": "e2b.loopback", "http_version": "1.1"}
    sbx = Sandbox.create(template="base", metadata={"bench": "1"}, timeout=300, **params)
    sbx.files.write_files([{"path": f"{WORKDIR}/{name}", "data": data}
                           for name, data in files.items()])
    sbx.commands.run(_start_command(WORKDIR, argv), envs=dict(env), timeout=0)
    return sbx.sandbox_id, lambda: Sandbox.kill(sbx.sandbox_id, **params)


def bare_modal(double: Any, files: Mapping[str, bytes], argv: Sequence[str],
               env: Mapping[str, str]) -> Started:
    import modal

    from tasks.sandbox.providers.modal import commands
    from tasks.sandbox.providers.modal.session import Options, session

    # The SDK's client, app and image, opened once (as any long-lived user would).
    s = session(Options(app_name="playrun-bare", image="python:3.12-slim",
                        environ=tuple(sorted(double.env.items()))))
    entry = commands.entrypoint(WORKDIR, timeout_s=300, linger_s=60)

    async def go() -> Any:
        client = await s.client()
        app = await s.app()
        sandbox = await modal.Sandbox.create.aio(*entry, app=app, image=s.image(),
                                                 timeout=300, client=client)
        # The files at once, as the adapter writes them: the baseline is the best bare path.
        await asyncio.gather(*(sandbox.filesystem.write_bytes.aio(data, f"{WORKDIR}/{name}")
                               for name, data in files.items()))
        await sandbox.filesystem.write_bytes.aio(
            bootstrap.launch_json(argv, env, 60), f"{WORKDIR}/{bootstrap.LAUNCH_FILE}")
        return sandbox

    sandbox = s.call(go, doing="bare start", timeout_s=120)
    return sandbox.object_id, lambda: s.call(lambda: sandbox.terminate.aio(),
                                             doing="terminate", timeout_s=60)


def bare_agentcore(double: Any, files: Mapping[str, bytes], argv: Sequence[str],
                   env: Mapping[str, str]) -> Started:
    import uuid

    import boto3

    from tasks.sandbox.providers.agentcore.client import merge_results

    client = _cached("agentcore", lambda: boto3.session.Session().client("bedrock-agentcore"))
    interpreter, workdir = "aws.codeinterpreter.v1", "playrun"
    answer = client.start_code_interpreter_session(
        codeInterpreterIdentifier=interpreter, name=f"bare-{uuid.uuid4().hex[:12]}",
        sessionTimeoutSeconds=300)
    session_id = answer["sessionId"]

    def tool(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        streamed = client.invoke_code_interpreter(
            codeInterpreterIdentifier=interpreter, sessionId=session_id, name=name,
            arguments=arguments)
        return merge_results(streamed["stream"], name)

    every = {**files, bootstrap.ENV_FILE: bootstrap.env_json(env)}
    tool("writeFiles", {"content": [{"path": f"{workdir}/{name}", "text": data.decode()}
                                    for name, data in every.items()]})
    done = tool("executeCommand",
                {"command": _start_command(workdir, argv, bootstrap.ENV_FILE)})
    assert done["structuredContent"].get("exitCode") == 0, json.dumps(done)[:300]
    return session_id, lambda: client.stop_code_interpreter_session(
        codeInterpreterIdentifier=interpreter, sessionId=session_id)


_clients: dict[str, Any] = {}


def _cached(name: str, make: Callable[[], Any]) -> Any:
    if name not in _clients:
        _clients[name] = make()
    return _clients[name]


def forget_clients() -> None:
    _clients.clear()


BARE: dict[str, Callable[[Any, Mapping[str, bytes], Sequence[str], Mapping[str, str]],
                         Started]] = {
    "daytona": bare_daytona,
    "e2b": bare_e2b,
    "modal": bare_modal,
    "agentcore": bare_agentcore,
}
