"""Session names that carry a sandbox's labels, and the create token from its key.

Code Interpreter sessions have no tags: a session's name (1-100 characters) is the only
thing `ListCodeInterpreterSessions` returns to select by. A name is
`pr.k<key hash>` then one `.<code><value>` segment per label, e.g.
`pr.k1a2b3c4d5e6f.m1.r<run id>.g0.fdefault.L<hash>`: a lowercase code holds the value
itself, an uppercase code a hash of it (a value too long or with other characters), and
`.z` says some labels did not fit at all. The full labels are also uploaded with the
sandbox's files, read back only when the name cannot tell them.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

from tasks.constants import (
    LABEL_FLEET,
    LABEL_GENERATION,
    LABEL_LEASE,
    LABEL_MANAGED,
    LABEL_ORG,
    LABEL_RUN,
)

PREFIX = "pr"
MAX_NAME = 100  # StartCodeInterpreterSession's limit
KEY_HASH = 12
VALUE_HASH = 10
UNKNOWN_KEY_HASH = 6
MORE = "z"
# Priority order: the last ones are hashed, then dropped, first. GC reads run,
# generation and fleet from every sandbox it lists, so they stay readable longest.
CODES = {
    LABEL_MANAGED: "m",
    LABEL_RUN: "r",
    LABEL_GENERATION: "g",
    LABEL_FLEET: "f",
    LABEL_ORG: "o",
    LABEL_LEASE: "l",
}
_KEYS = {code: key for key, code in CODES.items()}
_VERBATIM = re.compile(r"[A-Za-z0-9_-]{0,64}")


def _digest(text: str, size: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:size]


def client_token(key: str) -> str:
    """StartCodeInterpreterSession's idempotency token: 33-256 of [a-zA-Z0-9-].

    Without a key every create is a new sandbox, as botocore's own random token makes it.
    """
    return f"playrun-{_digest(key, 64) if key else secrets.token_hex(32)}"


def key_code(key: str) -> str:
    return CODES.get(key) or "x" + _digest(key, UNKNOWN_KEY_HASH)


@dataclass
class _Segment:
    code: str  # lowercase; uppercased when hashed
    value: str
    hashed: bool = False
    dropped: bool = False

    def render(self) -> str:
        if self.hashed:
            return f".{self.code[0].upper()}{self.code[1:]}{_digest(self.value, VALUE_HASH)}"
        return f".{self.code}{self.value}"


def session_name(token: str, labels: Mapping[str, str]) -> str:
    """The name for a session made with this token and labels (deterministic)."""
    known = [k for k in CODES if k in labels]
    others = sorted(k for k in labels if k not in CODES)
    segments = [_Segment(key_code(k), labels[k]) for k in (*known, *others)]
    for seg in segments:
        seg.hashed = not _VERBATIM.fullmatch(seg.value)

    def render() -> str:
        kept = "".join(s.render() for s in segments if not s.dropped)
        more = f".{MORE}" if any(s.dropped for s in segments) else ""
        return f"{PREFIX}.k{_digest(token, KEY_HASH)}{kept}{more}"

    for seg in reversed(segments):  # first hash long values, least needed first
        if len(render()) <= MAX_NAME:
            return render()
        if not seg.hashed and len(seg.value) > VALUE_HASH:
            seg.hashed = True
    for seg in reversed(segments):
        if len(render()) <= MAX_NAME:
            break
        seg.dropped = True
    return render()


@dataclass
class ParsedName:
    """What a session's name says: the key hash and each label's value or hash."""

    key_hash: str
    verbatim: dict[str, str] = field(default_factory=dict)  # key code -> value
    hashed: dict[str, str] = field(default_factory=dict)  # key code -> value hash
    more: bool = False  # some labels are only in the uploaded labels file

    def matches(self, key: str, value: str) -> bool | None:
        """Whether the label is key=value: True, False, or None if the name cannot say."""
        code = key_code(key)
        if code in self.verbatim:
            return self.verbatim[code] == value
        if code in self.hashed:
            return self.hashed[code] == _digest(value, VALUE_HASH)
        return None if self.more else False

    def labels(self, query: Mapping[str, str]) -> dict[str, str] | None:
        """The labels, if the name and the matching query tell them all; else None."""
        found = {_KEYS[c]: v for c, v in self.verbatim.items() if c in _KEYS}
        told = {key_code(k): (k, v) for k, v in query.items()}
        for code in self.hashed:
            if code not in told:
                return None
            found[told[code][0]] = told[code][1]
        if self.more or any(c not in _KEYS for c in self.verbatim):
            return None
        return found


def parse_name(name: str) -> ParsedName | None:
    """A name this module made, read back; None for any other session's name."""
    parts = name.split(".")
    if len(parts) < 2 or parts[0] != PREFIX or not parts[1].startswith("k"):
        return None
    parsed = ParsedName(parts[1][1:])
    for seg in parts[2:]:
        if seg == MORE:
            parsed.more = True
            continue
        if not seg:
            return None
        size = 1 + UNKNOWN_KEY_HASH if seg[0] in "xX" else 1
        code, value = seg[:size], seg[size:]
        if code.lower() not in _KEYS and not code.lower().startswith("x"):
            return None
        if code[0].isupper():
            parsed.hashed[code.lower()] = value
        else:
            parsed.verbatim[code] = value
    return parsed


def key_hash(token: str) -> str:
    return _digest(token, KEY_HASH)
