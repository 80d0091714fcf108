"""The size limit on request bodies: every route, enforced before any route reads.

Rules:
- A declared ``Content-Length`` over the route's limit gets 413 at once; nothing is read.
- A body of undeclared length (chunked) is counted as it arrives: past the limit, ``receive``
  raises the 413 that the route answers with. Either way the connection then closes, so the
  rest of the body is never read.
- One limit for every route, larger ones only where a route needs them (``/v1/files`` uploads).
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.types import Message, Receive, Scope

from priority_gateway.errors import ApiError

_CLOSE = [(b"connection", b"close")]


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"request body exceeds the limit of {limit} bytes", "body_too_large", headers=list(_CLOSE))


class BodyLimits:
    def __init__(self, default: int, routes: Mapping[str, int]) -> None:
        self.default = default
        self.routes = dict(routes)

    def limit(self, path: str) -> int:
        return self.routes.get(path, self.default)

    def bounded(self, scope: Scope, receive: Receive) -> Receive:
        """``receive``, bounded to the route's limit; raises the 413 when the declared length is over it."""
        limit = self.limit(scope["path"])
        declared: int | None = None
        chunked = False
        for name, value in scope["headers"]:
            if name == b"content-length":
                declared = int(value) if value.isdigit() else None
            elif name == b"transfer-encoding":
                chunked = True
        if chunked:
            return _counting(receive, limit)
        if declared is not None and declared > limit:
            raise too_large(limit)
        # The server delivers no more than the declared length (and nothing without one).
        return receive


def _counting(receive: Receive, limit: int) -> Receive:
    seen = 0

    async def bounded() -> Message:
        nonlocal seen
        message = await receive()
        body = message.get("body")
        if body:
            seen += len(body)
            if seen > limit:
                raise too_large(limit)
        return message

    return bounded
