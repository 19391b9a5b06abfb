"""Cloud sandbox providers on their official SDKs, each an optional extra.

The registry names every remote provider without importing its SDK: a worker whose
extra is missing learns so from one coded line at start-up, not from an ImportError
in the middle of a run.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tasks.constants import PROVIDER_NAMES
from tasks.errors import ConfigurationError

if TYPE_CHECKING:
    from tasks.sandbox.base import SandboxProvider
    from tasks.settings import Settings


class ProviderUnknownError(ConfigurationError):
    """No sandbox provider has this name."""

    code = "PROVIDER_UNKNOWN"


class ProviderExtraMissingError(ConfigurationError):
    """The provider's SDK is not installed."""

    code = "PROVIDER_EXTRA_MISSING"


class ProviderCredentialsMissingError(ConfigurationError):
    """The provider's SDK has no credentials in its environment variables."""

    code = "PROVIDER_CREDENTIALS_MISSING"


@dataclass(frozen=True)
class RemoteEntry:
    module: str
    cls: str
    extra: str  # pip install 'playrun[<extra>]'
    sdk: str  # the import that proves the extra is installed
    # Any one of these groups set is enough (each group: every variable in it).
    credentials: tuple[tuple[str, ...], ...]


REMOTE: dict[str, RemoteEntry] = {
    "daytona": RemoteEntry("tasks.sandbox.providers.daytona", "DaytonaProvider", "daytona",
                           "daytona", (("DAYTONA_API_KEY",), ("DAYTONA_JWT_TOKEN",))),
    "e2b": RemoteEntry("tasks.sandbox.providers.e2b", "E2BProvider", "e2b", "e2b",
                       (("E2B_API_KEY",), ("E2B_ACCESS_TOKEN",))),
    "modal": RemoteEntry("tasks.sandbox.providers.modal", "ModalProvider", "modal", "modal",
                         (("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET"), ("MODAL_PROFILE",))),
    # boto3 finds credentials in files, instance roles and SSO too: checked by the SDK.
    "agentcore": RemoteEntry("tasks.sandbox.providers.agentcore", "AgentCoreProvider",
                             "agentcore", "boto3", ()),
}
LOCAL = ("local", "fake")
assert set(PROVIDER_NAMES) == {*LOCAL, *REMOTE}, "tasks.constants.PROVIDER_NAMES is stale"


def known() -> list[str]:
    return [*LOCAL, *REMOTE]


def is_remote(name: str) -> bool:
    return name in REMOTE


def entry(name: str) -> RemoteEntry:
    try:
        return REMOTE[name]
    except KeyError:
        raise ProviderUnknownError(
            f"unknown sandbox provider {name!r}; known: {', '.join(known())}") from None


def check_installed(name: str) -> RemoteEntry:
    """The provider's entry, once its SDK is importable (find_spec imports nothing)."""
    found = entry(name)
    if importlib.util.find_spec(found.sdk) is None:
        raise ProviderExtraMissingError(
            f"sandbox provider {name!r} needs its SDK: pip install 'playrun[{found.extra}]'")
    return found


def check_credentials(name: str, environ: dict[str, str] | None = None) -> None:
    """Names the variables the SDK reads; never reads their values into playrun."""
    found = entry(name)
    env = os.environ if environ is None else environ
    if not found.credentials:
        return
    if any(all(env.get(var) for var in group) for group in found.credentials):
        return
    wanted = " or ".join("+".join(group) for group in found.credentials)
    raise ProviderCredentialsMissingError(
        f"sandbox provider {name!r} has no credentials: set {wanted}")


def check_served(names: tuple[str, ...]) -> None:
    """Each provider a worker is told to serve: known, its SDK installed, its credentials
    set; the first that is not raises its coded error."""
    if not names:
        raise ProviderUnknownError("no sandbox provider named: set PLAYRUN_PROVIDERS")
    for name in names:
        if name in LOCAL:
            continue
        check_installed(name)
        check_credentials(name)


def load(name: str, root: Path, settings: Settings | None = None) -> SandboxProvider:
    """A remote provider's adapter, its SDK imported only now."""
    found = check_installed(name)
    check_credentials(name)
    module = importlib.import_module(found.module)
    provider: SandboxProvider = getattr(module, found.cls)(Path(root), settings=settings)
    return provider
