"""`playrun dashboard`: server-rendered pages for operators (Starlette + Jinja2).

Read-only but for "run again". No script anywhere: pages refresh themselves with a
meta refresh, filters are GET forms, the one write is a POST form behind a
confirmation page with a CSRF token. Every value a play, sandbox or operator wrote
is escaped by Jinja2's autoescape; the CSP forbids scripts outright.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import tasks
from tasks.constants import DASHBOARD_REFRESH_S, DASHBOARD_RUNS_PAGE, RunStatus
from tasks.dashboard.auth import COOKIE, SESSION_MAX_AGE_S, Access, Principal
from tasks.dashboard.fleet import fleet
from tasks.dashboard.runpage import failure_class, run_page
from tasks.errors import InputInvalidError, PlayrunError, RunNotFoundError
from tasks.parse.query import parse_moment
from tasks.settings import Settings

HERE = Path(__file__).resolve().parent
MAX_FORM_BYTES = 8192
SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'none'; style-src 'self'; img-src 'self'; "
                                 b"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
    (b"x-frame-options", b"DENY"),
]


def _when(value: datetime | None) -> str:
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M:%S UTC")


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    s = int(seconds)
    return f"{s} s" if s < 120 else f"{s // 60} min" if s < 7200 else f"{s // 3600} h"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters["when"] = _when
    env.filters["ago"] = _ago
    env.globals["failure_class"] = failure_class
    return env


class _SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers if scope["type"] == "http" else send)


Handler = Callable[[Request, Principal], Awaitable[Response]]


class Dashboard:
    def __init__(self, settings: Settings, access: Access) -> None:
        self.settings = settings
        self.access = access
        self.env = _environment()

    # -- rendering ---------------------------------------------------------------------

    def page(self, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        context.setdefault("refresh", None)
        context.setdefault("who", None)
        html = self.env.get_template(name).render(**context)
        return HTMLResponse(html, status_code=status)

    def refused(self, request: Request, status: int, why: str) -> HTMLResponse:
        response = self.page("refused.html", status, why=why,
                             next=request.url.path if request.method == "GET" else "/runs")
        if status == 401:
            response.headers["www-authenticate"] = 'Bearer realm="playrun dashboard"'
        return response

    def error(self, exc: PlayrunError, who: Principal | None) -> HTMLResponse:
        status = 404 if isinstance(exc, RunNotFoundError) else 400
        return self.page("error.html", status, who=who, code=exc.code, message=exc.message)

    # -- auth --------------------------------------------------------------------------

    def guarded(self, handler: Handler, *, write: bool = False) -> Callable[
            [Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            who = self.access.principal(request)
            if who is None:
                return self.refused(request, 401, "This page needs the dashboard token.")
            if write and not who.can_write:
                return self.refused(request, 403, "Running a run again needs the write token "
                                                  "(PLAYRUN_DASHBOARD_WRITE_TOKEN).")
            try:
                return await handler(request, who)
            except PlayrunError as exc:
                return self.error(exc, who)

        return endpoint

    async def form(self, request: Request) -> dict[str, str]:
        """A small url-encoded form: one value per field, or InputInvalidError."""
        if request.headers.get("content-type", "").split(";")[0].strip() != \
                "application/x-www-form-urlencoded":
            raise InputInvalidError("expected a form (application/x-www-form-urlencoded)")
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM_BYTES:
                raise InputInvalidError(f"form is over {MAX_FORM_BYTES} bytes")
        try:
            fields = parse_qs(body.decode("utf-8"), strict_parsing=False, max_num_fields=10)
        except (UnicodeDecodeError, ValueError) as exc:
            raise InputInvalidError(f"unreadable form: {exc}") from exc
        return {k: v[0] for k, v in fields.items()}

    async def login_page(self, request: Request) -> Response:
        return self.page("login.html", next=_local(request.query_params.get("next")),
                         failed=False)

    async def login(self, request: Request) -> Response:
        try:
            fields = await self.form(request)
        except InputInvalidError as exc:
            return self.error(exc, None)
        target = _local(fields.get("next"))
        role = self.access.role_of(fields.get("token", ""))
        if role is None:
            return self.page("login.html", 401, next=target, failed=True)
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(COOKIE, self.access.login_cookie(role), max_age=SESSION_MAX_AGE_S,
                            httponly=True, samesite="strict",
                            secure=request.url.scheme == "https")
        return response

    async def logout(self, request: Request) -> Response:
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, httponly=True, samesite="strict")
        return response

    # -- pages -------------------------------------------------------------------------

    async def runs(self, request: Request, who: Principal) -> Response:
        q = request.query_params
        wanted = q.get("run", "").strip().lower()
        if wanted:
            full = await run_in_threadpool(tasks.resolve_run_id, wanted)
            return RedirectResponse(f"/runs/{full}", status_code=303)
        shown = {k: q.get(k, "").strip() for k in ("status", "org", "code", "since", "until")}
        listed = await run_in_threadpool(
            lambda: tasks.list_runs(
                DASHBOARD_RUNS_PAGE + 1, shown["org"] or None, status=shown["status"] or None,
                code=shown["code"] or None, since=parse_moment(shown["since"], "since"),
                until=parse_moment(shown["until"], "until"), before=q.get("before") or None))
        more = len(listed) > DASHBOARD_RUNS_PAGE
        listed = listed[:DASHBOARD_RUNS_PAGE]
        older = None
        if more:
            older = "/runs?" + urlencode({**{k: v for k, v in shown.items() if v},
                                          "before": tasks.run_cursor(listed[-1])})
        return self.page("runs.html", who=who, runs=listed, filters=shown,
                         statuses=tuple(RunStatus), older=older, paged="before" in q,
                         refresh=None if "before" in q else DASHBOARD_REFRESH_S)

    async def run(self, request: Request, who: Principal) -> Response:
        run_id = request.path_params["run_id"]
        if len(run_id) != 32:
            full = await run_in_threadpool(tasks.resolve_run_id, run_id)
            return RedirectResponse(f"/runs/{full}", status_code=303)
        after_text = request.query_params.get("after", "")
        after = int(after_text) if after_text.isdigit() and len(after_text) < 19 else None
        tail = request.query_params.get("tail") == "1"
        found = await run_in_threadpool(lambda: run_page(run_id, after=after, tail=tail))
        return self.page("run.html", who=who, run=found, tail=tail, after=after,
                         refresh=DASHBOARD_REFRESH_S if after is None else None)

    async def fleet(self, request: Request, who: Principal) -> Response:
        return self.page("fleet.html", who=who,
                         fleet=await run_in_threadpool(fleet, self.settings),
                         refresh=DASHBOARD_REFRESH_S)

    async def confirm_again(self, request: Request, who: Principal) -> Response:
        found = await run_in_threadpool(run_page, request.path_params["run_id"])
        return self.page("again.html", who=who, run=found,
                         csrf=self.access.csrf_token(who, found.id))

    async def again(self, request: Request, who: Principal) -> Response:
        run_id = request.path_params["run_id"]
        fields = await self.form(request)
        nonce = self.access.check_csrf(who, run_id, fields.get("csrf", ""))
        if nonce is None:
            return self.refused(request, 403, "The confirmation expired or was not made for "
                                              "this run and session; confirm again.")
        # The nonce makes a repeated POST of one confirmation return the same new run.
        handle = await run_in_threadpool(
            lambda: tasks.run_again(run_id, idempotency_key=f"dashboard-again-{nonce}"))
        return RedirectResponse(f"/runs/{handle.id}", status_code=303)


def _local(target: str | None) -> str:
    """Only a path on this site is a place to go after login (no open redirect)."""
    if not target or not target.startswith("/") or target.startswith("//") \
            or "\\" in target or len(target) > 2000:
        return "/runs"
    return target


def create_app(settings: Settings, access: Access) -> ASGIApp:
    d = Dashboard(settings, access)
    css = (HERE / "templates" / "style.css").read_text("utf-8")

    async def healthz(_: Request) -> Response:
        return PlainTextResponse("ok")

    async def style(_: Request) -> Response:
        return Response(css, media_type="text/css")

    async def home(_: Request, __: Principal) -> Response:
        return RedirectResponse("/runs", status_code=303)

    routes = [
        Route("/healthz", healthz),
        Route("/style.css", style),
        Route("/login", d.login_page, methods=["GET"]),
        Route("/login", d.login, methods=["POST"]),
        Route("/logout", d.logout, methods=["POST"]),
        Route("/", d.guarded(home)),
        Route("/runs", d.guarded(d.runs)),
        Route("/fleet", d.guarded(d.fleet)),
        Route("/runs/{run_id}", d.guarded(d.run)),
        Route("/runs/{run_id}/again", d.guarded(d.confirm_again, write=True), methods=["GET"]),
        Route("/runs/{run_id}/again", d.guarded(d.again, write=True), methods=["POST"]),
    ]
    return _SecurityHeaders(Starlette(routes=routes))
