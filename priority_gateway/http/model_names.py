"""An aliased request's two names: the served one in what the engine gets, the public one in what the client gets.

Rules:
- Only a request whose public name is an alias pays anything here; every other body and answer
  is relayed as it came.
- The engine's body is serialised again with ``model`` set to the served name.
- vLLM echoes ``model`` in every answer object and every streamed event (compact JSON); each
  occurrence of the served name as ``"model"``'s value becomes the public name, byte for byte, so
  nothing else of the answer is parsed or changed.
- A stream may be cut anywhere between reads: a chunk's tail that could begin an occurrence is
  held back and sent with the next chunk (or at the end), never more than one pattern's length.
"""

from __future__ import annotations

from typing import Any

import orjson

from priority_gateway.errors import ApiError


def with_model(parsed: dict[str, Any], served: str) -> bytes:
    """The request body with ``model`` set to ``served``."""
    parsed = {**parsed, "model": served}
    try:
        return orjson.dumps(parsed)
    except orjson.JSONEncodeError:
        raise ApiError(400, "request body is nested too deeply to be forwarded", "invalid_json") from None


class ModelNames:
    __slots__ = ("_pairs",)

    def __init__(self, public: str, served: str) -> None:
        pub, srv = orjson.dumps(public), orjson.dumps(served)
        self._pairs = ((b'"model":' + srv, b'"model":' + pub), (b'"model": ' + srv, b'"model": ' + pub))

    def restore(self, data: bytes) -> bytes:
        """``data`` with the served name put back as the public one wherever it is ``model``'s value."""
        for served, public in self._pairs:
            if served in data:
                data = data.replace(served, public)
        return data

    def restore_stream(self, data: bytes) -> tuple[bytes, bytes]:
        """What of ``data`` (held bytes plus a new chunk) may go now, restored, and what to hold back."""
        data = self.restore(data)
        keep = 0
        for served, _ in self._pairs:
            for k in range(min(len(served) - 1, len(data)), keep, -1):
                if data.endswith(served[:k]):
                    keep = k
                    break
        return (data[: len(data) - keep], data[len(data) - keep :]) if keep else (data, b"")
