"""Agent sessions through real processes: two ``gateway serve`` replicas on a real ``redis-server`` agree on
what a paused session holds, the hold expires on its own, and sessions are recognised from what the
``openai`` client sends (headers, ``prompt_cache_key``, ``user``), bad values included."""

from __future__ import annotations

import openai
import pytest

from tests.support.observe import metric, wait_for
from tests.support.procs import Proc, start_engine, start_gateway
from tests.support.redis import RedisServer

pytestmark = pytest.mark.redis

MODEL = "sim-model"
HELD = "gateway_engine_session_kv_held_tokens"


@pytest.fixture(scope="module")
def stack(procs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("holds")
    redis = RedisServer(tmp_path_factory.mktemp("redis")).start()
    engines = [start_engine(tmp, "--token-delay-ms", "1") for _ in range(2)]
    procs.extend(engines)
    for engine in engines:
        engine.wait_ready()
    config = {
        "pools": {"interactive": {"engines": [e.url for e in engines]}},
        "store": redis.url,
        # Long enough to be seen held by both replicas, short enough that each case waits little for the last.
        "sessions": {"default_hold_s": 1.5},
    }
    pair = [start_gateway(tmp, config) for _ in range(2)]
    procs.extend(pair)
    for gateway in pair:
        gateway.wait_ready("/ready")
        assert wait_for(lambda g=gateway: metric(g.url, "gateway_routing_share_up") == 1), gateway.log()
    yield pair
    redis.stop()


def chat(gateway: Proc, text: str, headers: dict[str, str] | None = None, **body: object) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="none", max_retries=0, timeout=30)
    answer = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": text}],
        max_tokens=8,
        extra_headers=headers or {},
        extra_body=body or None,
    )
    assert answer.choices[0].message.content


def held(gateway: Proc, replica: str) -> float:
    return metric(gateway.url, HELD, replica=replica)


def test_a_paused_sessions_hold_is_shared_by_both_replicas_and_expires(stack):
    a, b = stack
    assert held(a, "own") == 0 and held(b, "others") == 0
    chat(a, "plan the refactoring of the parser " * 4, {"X-Session-ID": "agent-1"})
    # The session paused on its engine: replica a holds its context, and b hears it through Redis.
    assert wait_for(lambda: held(a, "own") > 0), a.log()
    tokens = held(a, "own")
    assert wait_for(lambda: held(b, "others") == tokens), b.log()
    assert held(b, "own") == 0
    # Its hold ends default_hold_s after the turn (no pause learned yet): both replicas let it go.
    assert wait_for(lambda: held(a, "own") == 0 and held(b, "others") == 0, timeout=10), (a.log(), b.log())


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        ({"x-session-affinity": "s-affinity"}, {}),
        ({"session-id": "s-plain"}, {}),
        ({"x-claude-code-session-id": "s-claude"}, {}),
        ({"x-gateway-inference-fairness-id": "s-llmd"}, {}),
        ({}, {"prompt_cache_key": "s-cache-key"}),
        ({}, {"user": "s-user"}),
        ({}, {"safety_identifier": "s-safety"}),
        ({"x-session-id": "s" * 20_000}, {}),  # huge: hashed to a bounded key
        ({}, {"prompt_cache_key": "séance-ünïcode"}),  # non-ASCII: hashed
    ],
)
def test_each_source_makes_a_turn_a_sessions_turn(stack, headers, body):
    a, _ = stack
    assert wait_for(lambda: held(a, "own") == 0, timeout=10)
    chat(a, "one turn of a session", headers, **body)
    assert wait_for(lambda: held(a, "own") > 0), a.log()


@pytest.mark.parametrize(("headers", "body"), [({"x-session-id": ""}, {}), ({}, {"user": "   "}), ({}, {})])
def test_an_empty_session_value_is_no_session_and_no_error(stack, headers, body):
    a, _ = stack
    assert wait_for(lambda: held(a, "own") == 0, timeout=10)
    chat(a, "a request of no session", headers, **body)
    assert held(a, "own") == 0
