"""Who may see the dashboard, and who may run a run again.

A request proves a token with `Authorization: Bearer TOKEN` (scripts) or with the
signed, HttpOnly, SameSite=Strict cookie the login form sets (browsers). Tokens are
compared in constant time. The cookie is signed with a key derived from the tokens, so
changing a token signs every browser out. The write action also needs a CSRF token
bound to the run and to the signed-in session, with its own expiry.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

from itsdangerous import BadData, URLSafeTimedSerializer
from starlette.requests import Request

COOKIE = "playrun_dashboard"
SESSION_MAX_AGE_S = 12 * 3600
CSRF_MAX_AGE_S = 15 * 60


class Role(enum.Enum):
    READ = "read"
    WRITE = "write"  # also reads


@dataclass(frozen=True)
class Principal:
    role: Role
    session: str  # the login's random id, or a digest of the bearer token

    @property
    def can_write(self) -> bool:
        return self.role is Role.WRITE


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


class Access:
    def __init__(self, read_token: str, write_token: str | None) -> None:
        self._read = _digest(read_token)
        self._write = _digest(write_token) if write_token else None
        key = hashlib.sha256(b"playrun-dashboard\0" + self._read + b"\0"
                             + (self._write or b"")).hexdigest()
        self._cookies = URLSafeTimedSerializer(key, salt="playrun-dashboard-login")
        self._csrf = URLSafeTimedSerializer(key, salt="playrun-dashboard-csrf")

    def role_of(self, token: str) -> Role | None:
        given = _digest(token)
        # Both comparisons always run: the time taken says nothing about which matched.
        is_write = self._write is not None and hmac.compare_digest(given, self._write)
        is_read = hmac.compare_digest(given, self._read)
        if is_write:
            return Role.WRITE
        return Role.READ if is_read else None

    def login_cookie(self, role: Role) -> str:
        return str(self._cookies.dumps({"r": role.value, "s": secrets.token_hex(16)}))

    def principal(self, request: Request) -> Principal | None:
        header = request.headers.get("authorization", "")
        if header:
            scheme, _, token = header.partition(" ")
            role = self.role_of(token.strip()) if scheme.lower() == "bearer" else None
            return None if role is None else Principal(
                role, "bearer-" + hashlib.sha256(token.strip().encode()).hexdigest()[:16])
        cookie = request.cookies.get(COOKIE)
        if not cookie or len(cookie) > 512:
            return None
        try:
            data: Any = self._cookies.loads(cookie, max_age=SESSION_MAX_AGE_S)
            return Principal(Role(data["r"]), str(data["s"]))
        except (BadData, KeyError, TypeError, ValueError):
            return None

    def csrf_token(self, who: Principal, run_id: str) -> str:
        return str(self._csrf.dumps({"run": run_id, "s": who.session,
                                     "n": secrets.token_hex(12)}))

    def check_csrf(self, who: Principal, run_id: str, token: str) -> str | None:
        """The token's nonce if it was made for this session and run and is fresh."""
        if not token or len(token) > 512:
            return None
        try:
            data: Any = self._csrf.loads(token, max_age=CSRF_MAX_AGE_S)
        except BadData:
            return None
        if not isinstance(data, dict) or data.get("run") != run_id \
                or data.get("s") != who.session:
            return None
        nonce = data.get("n")
        return nonce if isinstance(nonce, str) else None
