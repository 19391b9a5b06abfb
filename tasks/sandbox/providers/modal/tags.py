"""playrun's labels as Modal sandbox tags, and the sandbox name an attempt's key gives.

Modal tags are 1-63 characters of [A-Za-z0-9._-]. A label that does not fit is stored
encoded (base64url under a prefix) or, when even that is too long, as a digest: both are
deterministic, so a list filter encodes its labels the same way and still matches.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
import re
from collections.abc import Mapping

# Modal's Sandbox.list returns handles without a creation time: the tag carries one.
CREATED_TAG = "playrun.created"
_VALID = re.compile(r"^[A-Za-z0-9._-]{1,63}$")
_ENCODED = "_b."
_DIGEST = "_h."
# Sandbox names: at most 64 of [A-Za-z0-9-_.] (modal/_utils/name_utils.py).
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def encode(value: str) -> str:
    if _VALID.match(value) and not value.startswith((_ENCODED, _DIGEST)):
        return value
    packed = _ENCODED + base64.urlsafe_b64encode(value.encode()).decode().rstrip("=")
    if len(packed) <= 63:
        return packed
    return _DIGEST + hashlib.sha256(value.encode()).hexdigest()[:60]


def decode(value: str) -> str:
    if not value.startswith(_ENCODED):
        return value  # plain, or a digest that cannot be turned back
    body = value[len(_ENCODED) :]
    try:
        return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError):
        return value


def to_tags(labels: Mapping[str, str]) -> dict[str, str]:
    return {encode(k): encode(v) for k, v in labels.items()}


def creation_tags(labels: Mapping[str, str], created_at: float) -> dict[str, str]:
    return {**to_tags(labels), CREATED_TAG: f"{created_at:.3f}"}


def from_tags(tags: Mapping[str, str]) -> tuple[dict[str, str], float]:
    """The labels and the creation time (0.0 if the tag is absent or garbled)."""
    labels = {decode(k): decode(v) for k, v in tags.items() if k != CREATED_TAG}
    try:
        created = float(tags.get(CREATED_TAG, "0"))
    except ValueError:
        created = 0.0
    return labels, created if math.isfinite(created) and created > 0 else 0.0


def sandbox_name(key: str) -> str | None:
    """The attempt's key as a Modal sandbox name (unique per app: the idempotency key)."""
    if not key:
        return None
    if _NAME.match(key):
        return key
    return "pr-" + hashlib.sha256(key.encode()).hexdigest()[:40]
