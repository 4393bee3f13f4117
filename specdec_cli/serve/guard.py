"""Who may talk to the server, checked before any route runs.

A server on loopback with no key is reachable from every web page its user opens: a page may
send a "simple" cross-origin POST (text/plain, no preflight) and make it generate, and with
DNS rebinding (a name that resolves to 127.0.0.1 after the page has loaded) read the answer.
llama.cpp's server and Ollama went through this; Ollama checks Host and Origin against allow
lists (OLLAMA_ORIGINS). So:

- On a loopback bind, the Host header must name a loopback address or name (or an allowed
  host): a rebound name is refused.
- A request that carries an Origin (browsers add it to cross-origin requests) is refused
  unless that origin is allowed. CORS is refused by default: only allowed origins get CORS
  headers, and their preflights an answer.
- A request with a body must send it as JSON (application/json, any charset): a page cannot
  send that cross-origin without a preflight, which is refused.

Refusals are OpenAI-shaped errors: 403 (host, origin) and 415 (content type).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .serve_protocol import ApiError

ANY = "*"
LOOPBACK_NAMES = ("localhost",)  # and every name under .localhost (RFC 6761)
PREFLIGHT_MAX_AGE = 600  # seconds a browser may keep an allowed preflight
CORS_HEADERS = "Authorization, Content-Type"


@dataclass(frozen=True)
class Guard:
    """What the server accepts: `check_host` on a loopback bind; `hosts` and `origins` the
    user allowed ("*" in `origins`: any origin)."""

    check_host: bool
    hosts: frozenset[str] = frozenset()
    origins: frozenset[str] = frozenset()

    @classmethod
    def for_bind(cls, loopback: bool, hosts: Iterable[str], origins: Iterable[str]) -> Guard:
        return cls(
            check_host=loopback,
            hosts=frozenset(host.lower() for host in hosts),
            origins=frozenset(origin.rstrip("/").lower() for origin in origins),
        )

    def origin_allowed(self, origin: str) -> bool:
        return ANY in self.origins or origin.rstrip("/").lower() in self.origins

    def refusal(self, method: str, headers: Headers) -> ApiError | None:
        """Why a request is refused, or None."""
        host = headers.get("host")
        if self.check_host and host is not None and not self._host_allowed(host):
            return ApiError(
                403,
                f"Host '{host}' is not allowed: this server listens on loopback. Use "
                "localhost or 127.0.0.1, or start it with --allow-host NAME.",
                code="host_not_allowed",
            )
        origin = headers.get("origin")
        if origin is not None and not self.origin_allowed(origin):
            return ApiError(
                403,
                f"Origin '{origin}' is not allowed. Start the server with --allow-origin "
                "ORIGIN to let pages from it call the API.",
                code="origin_not_allowed",
            )
        if _has_body(headers) and not _is_json(headers.get("content-type", "")):
            return ApiError(
                415,
                "Send the request body as JSON, with 'Content-Type: application/json'.",
                code="unsupported_media_type",
            )
        return None

    def _host_allowed(self, host: str) -> bool:
        name = _host_name(host)
        if name in self.hosts or name in LOOPBACK_NAMES or name.endswith(".localhost"):
            return True
        try:
            return ipaddress.ip_address(name).is_loopback
        except ValueError:
            return False


def _host_name(host: str) -> str:
    """The Host header without its port, lower case, IPv6 without brackets."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host[1:]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _has_body(headers: Headers) -> bool:
    return headers.get("content-length", "0") not in ("", "0") or "transfer-encoding" in headers


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json"


class GuardMiddleware:
    """`guard` in front of an ASGI app; `refused(scope, error)` hears of each refusal (the
    request log)."""

    def __init__(
        self,
        app: ASGIApp,
        guard: Guard,
        refused: Callable[[Scope, ApiError], None] = lambda scope, error: None,
    ) -> None:
        self.app = app
        self.guard = guard
        self.refused = refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        method = scope["method"]
        error = self.guard.refusal(method, headers)
        if error is not None:
            self.refused(scope, error)
            response: Response = JSONResponse(error.body(), status_code=error.status)
            await response(scope, receive, send)
            return
        origin = headers.get("origin")
        if origin is None:
            await self.app(scope, receive, send)
        elif method == "OPTIONS" and "access-control-request-method" in headers:
            await _preflight(origin)(scope, receive, send)
        else:
            await self.app(scope, receive, _with_cors(send, origin))


def _preflight(origin: str) -> Response:
    return Response(
        status_code=204,
        headers={
            "Access-Control-Allow-Origin": origin,
            "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
            "Access-Control-Allow-Headers": CORS_HEADERS,
            "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE),
            "Vary": "Origin",
        },
    )


def _with_cors(send: Send, origin: str) -> Callable[[Message], Awaitable[None]]:
    async def send_with_cors(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = MutableHeaders(scope=message)
            headers["Access-Control-Allow-Origin"] = origin
            headers.append("Vary", "Origin")
        await send(message)

    return send_with_cors
