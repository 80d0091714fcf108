"""Recognising a request's agent session or conversation, as clients send it.

Rules:
- Sources, tried in the configured order (``sessions.sources``), the first that gives a usable
  value wins: request headers (``x-session-id``, ``x-session-affinity``, ``session-id``,
  ``x-claude-code-session-id``, llm-d's ``x-gateway-inference-fairness-id``), then body fields:
  OpenAI's ``prompt_cache_key``, the Responses API's ``conversation`` (a string or an object's
  ``id``) and ``previous_response_id``, and the end user (``safety_identifier``, ``user``).
- A value is usable when, stripped of surrounding blanks, it is not empty and is a string (any other
  JSON type is the engine's to judge, never an error here). Empty values fall through to the next
  source.
- Bounded: a value of at most ``MAX_PLAIN_CHARS`` printable ASCII characters is the key as it is;
  anything longer or outside that (non-ASCII, control characters) becomes ``~`` and the hex of its
  128-bit xxhash, so a key is never longer than ``MAX_PLAIN_CHARS``, never carries a client's bytes
  to a log line unescaped, and equal values still give equal keys. Only ``MAX_READ_BYTES`` of a
  value are read.
- Keys are scoped by the source's kind (``h:`` header, ``b:`` body field name) and, in the proxy, by
  the tenant, so one tenant's session ids never meet another's.
- A session key is never a metric label, and never leaves the gateway: it names the session to the
  core (``RouteRequest.session``) and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

from xxhash import xxh3_128_hexdigest

SessionSource = Literal[
    "x-session-id",
    "x-session-affinity",
    "session-id",
    "x-claude-code-session-id",
    "x-gateway-inference-fairness-id",
    "prompt_cache_key",
    "conversation",
    "previous_response_id",
    "safety_identifier",
    "user",
]
SOURCES: tuple[SessionSource, ...] = get_args(SessionSource)
HEADER_SOURCES = frozenset(s for s in SOURCES if "-" in s)
SESSION_HEADERS = frozenset(s.encode() for s in HEADER_SOURCES)
"""Header names (lower case, as ASGI gives them) the request path collects for recognition."""
DEFAULT_SOURCES: tuple[SessionSource, ...] = SOURCES
MAX_PLAIN_CHARS = 128
MAX_READ_BYTES = 8192


def normalise(value: str | bytes) -> str | None:
    """The bounded key for a client's value (None: empty)."""
    raw = value[:MAX_READ_BYTES]
    text = raw.decode("latin-1") if isinstance(raw, bytes) else raw
    text = text.strip()
    if not text:
        return None
    if len(text) <= MAX_PLAIN_CHARS and text.isascii() and text.isprintable():
        return text
    return "~" + xxh3_128_hexdigest(text.encode("utf-8", "surrogatepass"))


class SessionRecognition:
    def __init__(self, sources: Sequence[SessionSource] = DEFAULT_SOURCES, enabled: bool = True) -> None:
        unknown = [s for s in sources if s not in SOURCES]
        if unknown:
            raise ValueError(f"unknown session sources: {', '.join(unknown)}")
        self.sources = tuple(sources) if enabled else ()
        # Asked on every request: each source's header name encoded once (None for a body field).
        self._lookups = tuple((s, s.encode() if s in HEADER_SOURCES else None) for s in self.sources)

    def key(self, headers: Mapping[bytes, bytes] | None, parsed: Mapping[str, Any]) -> str | None:
        """The request's session key, or None when no source gives one."""
        for source, header in self._lookups:
            if header is not None:
                value = headers.get(header) if headers else None
                key = normalise(value) if value is not None else None
                if key is not None:
                    return "h:" + key
                continue
            found = _body_value(parsed, source)
            if found is not None and (key := normalise(found)) is not None:
                return f"b:{source}:{key}"
        return None


def _body_value(parsed: Mapping[str, Any], field: str) -> str | None:
    value = parsed.get(field)
    if value is None:
        return None
    if field == "conversation" and isinstance(value, dict):  # a parsed JSON object is a dict
        value = value.get("id")
    return value if isinstance(value, str) else None
