"""An aliased request's two names: the served one in what the engine gets, the public one in what the client gets.

Rules:
- Only a request whose public name is an alias pays anything here; every other body and answer
  is relayed as it came.
- The engine's body is serialised again with ``model`` set to the served name.
- vLLM echoes ``model`` in every answer object and every streamed event (compact JSON, one event
  per chunk it writes); each occurrence of the served name as ``"model"``'s value becomes the public
  name, byte for byte, so nothing else of the answer is parsed or changed.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import ApiError


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
