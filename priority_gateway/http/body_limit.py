"""The size limits on request bodies: every route, enforced before any route reads.

Rules:
- A declared ``Content-Length`` over the route's limit gets 413 at once; nothing is read.
- A body of undeclared length (chunked) is counted as it arrives: past the limit, ``receive``
  raises the 413 that the route answers with. Either way the connection then closes, so the
  rest of the body is never read.
- One limit for every route, larger ones only where a route needs them (``/v1/files`` uploads).
- The bodies being received, on all connections together, stay within ``receiving`` bytes: a
  declared length is reserved whole when its head arrives, a chunked body as its chunks do, and
  either is given back once the body has arrived or its request has ended. A body that does not
  fit gets 503 ``bodies_in_flight`` with ``Retry-After``; one larger than the whole budget, 413.
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.types import Message, Receive, Scope

from priority_gateway.errors import ApiError

_CLOSE = [(b"connection", b"close")]
RETRY_AFTER_S = 1.0


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"request body exceeds the limit of {limit} bytes", "body_too_large", headers=list(_CLOSE))


def _no_room(limit: int) -> ApiError:
    return ApiError(
        503,
        f"the gateway is receiving {limit} bytes of request bodies already; retry shortly",
        "bodies_in_flight",
        retry_after_s=RETRY_AFTER_S,
        headers=list(_CLOSE),
    )


class BodyLimits:
    def __init__(self, default: int, routes: Mapping[str, int], receiving: int | None = None) -> None:
        self.default = default
        self.routes = dict(routes)
        self.receiving = receiving if receiving is not None else max(default, *self.routes.values(), 0)
        self.held = 0
        """Bytes of the bodies being received now, together."""

    def limit(self, path: str) -> int:
        return self.routes.get(path, self.default)

    def bounded(self, scope: Scope, receive: Receive) -> Receive:
        """``receive``, bounded to the route's limit and the shared budget; raises the 413 (or 503)
        when the declared length is over them. A request with a body must ``release`` what the
        returned channel holds when it ends (``Receiving.release``)."""
        limit = self.limit(scope["path"])
        declared: int | None = None
        chunked = False
        for name, value in scope["headers"]:
            if name == b"content-length":
                declared = int(value) if value.isdigit() else None
            elif name == b"transfer-encoding":
                chunked = True
        if chunked:
            return Receiving(self, receive, limit, 0)
        if not declared:
            # The server delivers no more than the declared length (and nothing without one).
            return receive
        if declared > limit:
            raise too_large(limit)
        if declared > self.receiving:
            raise too_large(self.receiving)
        if self.held + declared > self.receiving:
            raise _no_room(self.receiving)
        self.held += declared
        return Receiving(self, receive, None, declared)


class Receiving:
    """One request's body on its way in: what it holds of the shared budget, given back at its end."""

    __slots__ = ("_budget", "_receive", "held", "limit", "seen")

    def __init__(self, budget: BodyLimits, receive: Receive, limit: int | None, held: int) -> None:
        self._budget = budget
        self._receive = receive
        self.limit = limit
        """The route's limit, counted as chunks arrive (None: the declared length was checked)."""
        self.held = held
        self.seen = 0

    async def __call__(self) -> Message:
        message = await self._receive()
        if self.limit is not None:
            body = message.get("body")
            if body:
                self.seen += len(body)
                if self.seen > self.limit:
                    self.release()
                    raise too_large(self.limit)
                budget = self._budget
                if budget.held + len(body) > budget.receiving:
                    self.release()
                    raise _no_room(budget.receiving)
                budget.held += len(body)
                self.held += len(body)
        if self.held and not message.get("more_body"):
            self.release()
        return message

    def release(self) -> None:
        self._budget.held -= self.held
        self.held = 0
