"""Bearer auth (--api-key / METRALE_API_KEY) and the warning for an open, unauthenticated bind.

With a key set, every route but /health needs `Authorization: Bearer <key>` (or `x-api-key: <key>`,
as Anthropic's clients send it; the WebSocket route
on its upgrade request, before any frame); anything else gets a 401 in OpenAI's error shape. The
comparison is constant-time (hmac.compare_digest), so its timing says nothing about the key.
"""

from __future__ import annotations

import hmac
import ipaddress
import sys

from aiohttp import web

from runtime.openai_api import error_response

OPEN_ROUTES = frozenset({"/health"})  # a monitor or load balancer reads it without the key


def auth_middleware(api_key: str):
    expected = f"Bearer {api_key}".encode()

    @web.middleware
    async def check_key(request: web.Request, handler):
        if request.path in OPEN_ROUTES:
            return await handler(request)
        given = request.headers.get("Authorization", "").encode()
        if not given and "x-api-key" in request.headers:  # Anthropic's clients send the key so
            given = f"Bearer {request.headers['x-api-key']}".encode()
        if not hmac.compare_digest(given, expected):
            response = error_response("missing or wrong API key: send the header "
                                      "'Authorization: Bearer <key>' with the server's --api-key", 401)
            response.headers["WWW-Authenticate"] = "Bearer"
            return response
        return await handler(request)

    return check_key


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def warn_if_open(host: str, api_key: str | None, log) -> None:
    """Binding beyond loopback without a key serves the model to anyone who can reach the port."""
    if api_key is None and not is_loopback(host):
        hint = "set --api-key (or METRALE_API_KEY), or bind 127.0.0.1"
        log.warning("listening_without_api_key", host=host, hint=hint)
        print(f"metrale: WARNING: serving on {host} without an API key: anyone who can reach it can use it; "
              f"{hint}", file=sys.stderr, flush=True)
