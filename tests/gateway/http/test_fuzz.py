"""Property-based fuzzing of every client-facing route: 4xx in OpenAI's shape, never a 5xx of our own.

Most cases drive the ASGI app in-process (fast), in front of a real simulated engine over
loopback, so well-formed requests really are served; a smaller set goes over real HTTP to a
gateway process. Engines here are well-behaved, so any 5xx is the gateway's own.
"""

from __future__ import annotations

import asyncio
import json
import re
import string
from collections.abc import Iterator

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from priority_gateway.config import parse_config
from priority_gateway.http.app import GatewayApp
from priority_gateway.runtime import Gateway
from tests.support.asgi import Answer, call
from tests.support.examples import examples
from tests.support.procs import start_engine, start_gateway

MODEL = "sim-model"
FUZZ = settings(
    deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)

# -- strategies ------------------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


_DEEP = re.compile(r'"\\u0000deep(\d+)"')


def deep(depth: int) -> str:
    """A placeholder that ``dumps`` turns into arrays nested ``depth`` deep (no encoder nests that far)."""
    return f"\x00deep{depth}"


def dumps(value: object) -> bytes:
    text = json.dumps(value)
    return _DEEP.sub(lambda m: "[" * int(m.group(1)) + "1" + "]" * int(m.group(1)), text).encode()


odd = json_values | st.integers(200, 1100).map(deep)
small_tokens = st.integers(0, 6)
text_part = st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=30)})
part = text_part | st.fixed_dictionaries({"type": st.sampled_from(["image_url", "text", "x"])}) | odd
content = st.text(max_size=80) | st.lists(part, max_size=3) | odd
role = st.sampled_from(["user", "system", "assistant"]) | odd
message = st.fixed_dictionaries({"role": role, "content": content}) | odd
safe_extras = {
    "temperature": st.floats(0, 2) | odd,
    "top_p": st.floats(0, 1) | odd,
    "user": st.text(max_size=10) | odd,
    "seed": st.integers(0, 100) | odd,
    "stop": st.text(max_size=5) | odd,
    "priority": st.integers(-5, 5) | odd,
}
common = {
    "model": st.just(MODEL) | odd,
    "max_tokens": small_tokens | odd,
    "max_completion_tokens": small_tokens | odd,
    "stream": st.booleans() | odd,
    "cache_salt": st.text(max_size=8) | odd,
    **safe_extras,
}
chat_bodies = st.fixed_dictionaries({"messages": st.lists(message, min_size=1, max_size=3) | odd}, optional=common)
prompt = (
    st.text(max_size=80)
    | st.lists(st.text(max_size=20), min_size=1, max_size=3)
    | st.lists(st.integers(0, 1000), min_size=1, max_size=20)
    | st.lists(st.lists(st.integers(0, 1000), min_size=1, max_size=5), min_size=1, max_size=2)
    | odd
)
completion_bodies = st.fixed_dictionaries({"prompt": prompt}, optional=common)
embedding_bodies = st.fixed_dictionaries(
    {"input": st.text(max_size=40) | st.lists(st.text(max_size=10), max_size=3) | odd},
    optional={"model": st.just(MODEL) | odd, "encoding_format": st.sampled_from(["float", "base64"]) | odd},
)
response_item = (
    message
    | st.fixed_dictionaries(
        {"type": st.just("function_call"), "call_id": st.text(max_size=6)},
        optional={"name": st.text(max_size=8) | odd, "arguments": st.text(max_size=20) | odd},
    )
    | st.fixed_dictionaries(
        {"type": st.just("function_call_output"), "call_id": st.text(max_size=6)}, optional={"output": content}
    )
    | st.fixed_dictionaries(
        {"type": st.sampled_from(["message", "reasoning", "x"]) | odd}, optional={"role": role, "content": content}
    )
    | odd
)
response_bodies = st.fixed_dictionaries(
    {"input": st.text(max_size=40) | st.lists(response_item, min_size=1, max_size=3) | odd},
    optional={
        "model": st.just(MODEL) | odd,
        "instructions": st.text(max_size=20) | odd,
        "max_output_tokens": small_tokens | odd,
        "stream": st.booleans() | odd,
        **safe_extras,
    },
)
header_text = st.text(alphabet=string.printable.strip() + " ", max_size=40)
request_headers = st.fixed_dictionaries(
    {},
    optional={
        b"x-priority": st.sampled_from(["interactive", "batch", "BATCH", ""]) | header_text,
        b"x-slo-ttft-ms": st.sampled_from(["100", "0", "-1", "nan", "inf", "1e9"]) | header_text,
        b"x-slo-tpot-ms": header_text,
        b"x-request-id": header_text,
        b"x-session-id": header_text,
        b"content-type": st.sampled_from(["application/json", "text/plain"]),
    },
).map(lambda h: [(k, v.encode()) for k, v in h.items()])


def encoded(bodies: st.SearchStrategy[object]) -> st.SearchStrategy[bytes]:
    """JSON bodies, now and then mangled: truncated, not JSON at all, or a bare value."""
    as_json = bodies.map(dumps)
    return (
        as_json
        | as_json.flatmap(lambda b: st.integers(0, max(0, len(b) - 1)).map(lambda n: b[:n]))
        | st.binary(max_size=64)
        | json_values.map(dumps)
    )


ids = st.text(alphabet=string.ascii_letters + string.digits + "-_.~", min_size=1, max_size=40)
batch_bodies = st.fixed_dictionaries(
    {},
    optional={
        "input_file_id": ids | odd,
        "endpoint": st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/x"]) | odd,
        "completion_window": st.sampled_from(["24h", "1h"]) | odd,
        "metadata": st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3) | odd,
        "output_expires_after": st.fixed_dictionaries({"anchor": st.just("created_at"), "seconds": odd}) | odd,
    },
)


def multipart(fields: dict[str, bytes], filename: str | None) -> tuple[bytes, bytes]:
    out = []
    for name, value in fields.items():
        disposition = f'form-data; name="{name}"'
        if name == "file" and filename is not None:
            disposition += f'; filename="{filename}"'
        out.append(b"--fz\r\nContent-Disposition: " + disposition.encode() + b"\r\n\r\n" + value + b"\r\n")
    out.append(b"--fz--\r\n")
    return b"".join(out), b"multipart/form-data; boundary=fz"


line = st.fixed_dictionaries(
    {"custom_id": ids, "method": st.just("POST"), "url": st.just("/v1/chat/completions")},
    optional={"body": chat_bodies},
).map(dumps) | st.binary(max_size=40)
upload_fields = st.fixed_dictionaries(
    {},
    optional={
        "purpose": st.sampled_from([b"batch", b"fine-tune", b""]) | st.binary(max_size=10),
        "file": st.lists(line, max_size=4).map(lambda lines: b"\n".join(lines)),
        "expires_after[anchor]": st.sampled_from([b"created_at", b"x"]),
        "expires_after[seconds]": st.sampled_from([b"3600", b"-1", b"abc", b"99999999999"]),
    },
)

# -- checks ------------------------------------------------------------------------------------


def assert_no_gateway_failure(answer: Answer, what: object) -> None:
    assert answer.status < 500, (answer.status, answer.body[:300], what)
    if answer.status >= 400:
        error = orjson.loads(answer.body)["error"]
        assert set(error) == {"message", "type", "param", "code"}, answer.body[:300]
        assert isinstance(error["message"], str) and len(error["message"]) < 2000


# -- in-process ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(procs, tmp_path_factory):
    proc = start_engine(tmp_path_factory.mktemp("fuzz"), "--profile", "instant")
    procs.append(proc)
    return proc.wait_ready()


@pytest.fixture(scope="module")
def app(engine) -> Iterator[tuple[GatewayApp, asyncio.AbstractEventLoop]]:
    config = parse_config(
        {
            "pools": {
                "interactive": {"engines": [engine.url]},
                "batch": {"engines": [engine.url], "scheduling_policy": "priority"},
            },
            "keys": {"required": False},
            "store": "memory",
            "batch": {"max_file_bytes": 64 * 1024},
        }
    )
    gateway = Gateway(config)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(gateway.start())
    try:
        yield GatewayApp(gateway), loop
    finally:
        loop.run_until_complete(gateway.stop())
        loop.close()


def run(app: tuple[GatewayApp, asyncio.AbstractEventLoop], *args: object, **kwargs: object) -> Answer:
    gateway_app, loop = app
    return loop.run_until_complete(call(gateway_app, *args, **kwargs))


@settings(FUZZ, max_examples=examples(900))
@given(body=encoded(chat_bodies), headers=request_headers, chunked=st.booleans())
def test_chat_completions(app, body, headers, chunked):
    answer = run(app, "POST", "/v1/chat/completions", body, headers, chunked=chunked)
    assert_no_gateway_failure(answer, body)


@settings(FUZZ, max_examples=examples(600))
@given(body=encoded(completion_bodies), headers=request_headers)
def test_completions(app, body, headers):
    assert_no_gateway_failure(run(app, "POST", "/v1/completions", body, headers), body)


@settings(FUZZ, max_examples=examples(600))
@given(body=encoded(response_bodies), headers=request_headers)
def test_responses(app, body, headers):
    assert_no_gateway_failure(run(app, "POST", "/v1/responses", body, headers), body)


@settings(FUZZ, max_examples=examples(300))
@given(body=encoded(embedding_bodies), headers=request_headers)
def test_embeddings(app, body, headers):
    assert_no_gateway_failure(run(app, "POST", "/v1/embeddings", body, headers), body)


@settings(FUZZ, max_examples=examples(300))
@given(fields=upload_fields, filename=st.none() | st.text(alphabet=string.ascii_letters + ".", max_size=12))
def test_file_uploads(app, fields, filename):
    body, content_type = multipart(fields, filename)
    answer = run(app, "POST", "/v1/files", body, [(b"content-type", content_type)])
    assert_no_gateway_failure(answer, fields)


@settings(FUZZ, max_examples=examples(400))
@given(body=encoded(batch_bodies))
def test_batch_creation(app, body):
    assert_no_gateway_failure(run(app, "POST", "/v1/batches", body), body)


@settings(FUZZ, max_examples=examples(200))
@given(
    route=st.sampled_from(
        [
            ("GET", "/v1/files/{}"),
            ("GET", "/v1/files/{}/content"),
            ("DELETE", "/v1/files/{}"),
            ("GET", "/v1/batches/{}"),
            ("POST", "/v1/batches/{}/cancel"),
            ("GET", "/v1/models/{}"),
        ]
    ),
    object_id=ids,
    query=st.sampled_from([b"", b"limit=0", b"limit=5", b"limit=x", b"limit=99999", b"order=sideways", b"after=z"]),
)
def test_object_routes(app, route, object_id, query):
    method, path = route
    assert_no_gateway_failure(run(app, method, path.format(object_id), b"", query=query), (route, object_id))
    for listing in ("/v1/files", "/v1/batches"):
        assert_no_gateway_failure(run(app, "GET", listing, b"", query=query), (listing, query))


@settings(FUZZ, max_examples=examples(200))
@given(
    method=st.sampled_from(["GET", "PUT", "DELETE", "PATCH", "OPTIONS", "POST", "HEAD"]),
    path=st.sampled_from(
        [
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/embeddings",
            "/v1/responses",
            "/v1/responses/{}",
            "/v1/responses/{}/cancel",
            "/v1/files",
            "/v1/files/{}",
            "/v1/batches/{}/cancel",
            "/v1/models",
            "/health",
            "/metrics",
        ]
    ),
    object_id=ids,
)
def test_methods_on_known_paths(app, method, path, object_id):
    answer = run(app, method, path.format(object_id), b"")
    assert_no_gateway_failure(answer, (method, path))
    if answer.status == 405:
        assert answer.headers.get(b"allow"), (method, path)


# -- over real HTTP -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gateway_proc(procs, tmp_path_factory, engine):
    config = {
        "pools": {
            "interactive": {"engines": [engine.url]},
            "batch": {"engines": [engine.url], "scheduling_policy": "priority"},
        }
    }
    gw = start_gateway(tmp_path_factory.mktemp("fuzz-http"), config)
    procs.append(gw)
    return gw.wait_ready("/ready")


@settings(FUZZ, max_examples=examples(60))
@given(
    route=st.sampled_from(
        ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/batches", "/v1/responses"]
    ),
    chat=encoded(chat_bodies),
    completion=encoded(completion_bodies),
    response=encoded(response_bodies),
    headers=request_headers,
)
def test_over_real_http(gateway_proc, route, chat, completion, response, headers):
    body = {"/v1/completions": completion, "/v1/responses": response}.get(route, chat)
    # On the wire a header value has no surrounding whitespace (the client refuses to send it).
    sent = {name: value.strip() for name, value in headers}
    r = httpx.post(gateway_proc.url + route, content=body, headers=sent, timeout=30)
    answer = Answer(r.status_code, {}, r.content)
    assert_no_gateway_failure(answer, body)
