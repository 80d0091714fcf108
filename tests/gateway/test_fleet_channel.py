"""Two ``gateway serve`` replicas sharing a real ``redis-server``, in front of four simulated engines:
a conversation whose turns alternate between the replicas stays on one engine, and routing goes on
through a Redis outage, which the replicas report in their metrics and logs."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.support.observe import metric, wait_for
from tests.support.procs import Proc, start_engine, start_gateway
from tests.support.redis import RedisServer

pytestmark = pytest.mark.redis

MODEL = "sim-model"
# Shared by every prompt here, but short: it ends before the block that picks an engine for a prompt
# nobody has seen, so each conversation has an engine of its own.
PREAMBLE = "<|system|> Be brief. " * 8


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def redis_back(redis_server):
    """Redis answers again after each test, whatever it did to it: a test that failed during its
    outage leaves the module's other tests their server."""
    yield
    if redis_server.proc is None or not redis_server.proc.alive:
        redis_server.start()


@pytest.fixture(scope="module")
def engines(procs, tmp_path_factory) -> list[Proc]:
    tmp = tmp_path_factory.mktemp("engines")
    started = [start_engine(tmp, "--token-delay-ms", "1") for _ in range(4)]
    procs.extend(started)
    for engine in started:
        engine.wait_ready()
    return started


def replicas(procs, tmp, engines: list[Proc], redis_url: str, share: bool) -> tuple[Proc, Proc]:
    config = {
        "pools": {"interactive": {"engines": [e.url for e in engines]}},
        "store": redis_url,
        "fleet": {"enabled": share},
        # One scrape at the start: a later one taken while the other replica's request runs would
        # count it as the engine's own load for seconds, and this test's load is one request.
        "scrape": {"interval_s": 60},
    }
    pair = [start_gateway(tmp, config) for _ in range(2)]
    procs.extend(pair)
    for gateway in pair:
        gateway.wait_ready("/ready")
    if share:
        for gateway in pair:
            assert wait_for(lambda g=gateway: metric(g.url, "gateway_routing_share_up") == 1), gateway.log()
    return pair[0], pair[1]


def routed(gateway: Proc) -> dict[str, float]:
    text = httpx.get(gateway.url + "/metrics", timeout=5).text
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("gateway_routing_decisions_total{"):
            labels, value = line.rsplit(" ", 1)
            engine = labels.split('engine="', 1)[1].split('"', 1)[0]
            counts[engine] = counts.get(engine, 0.0) + float(value)
    return counts


def ask(gateway: Proc, messages: list[dict[str, str]]) -> str:
    """Send one chat turn through ``gateway``; answer the engine it went to."""
    before = routed(gateway)
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="none", max_retries=0)
    answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8)
    assert answer.choices[0].message.content
    after = routed(gateway)
    moved = [engine for engine, n in after.items() if n != before.get(engine, 0.0)]
    assert len(moved) == 1, (before, after)
    return moved[0]


def applied(gateway: Proc) -> float:
    return metric(gateway.url, "gateway_routing_share_facts_total", direction="applied")


def heard(receiver: Proc, before: float) -> None:
    """Until ``receiver`` has applied another fact than the ``before`` it had, and heard that the
    request behind it is over."""
    assert wait_for(lambda: applied(receiver) > before, timeout=5), receiver.log()
    assert wait_for(lambda: metric(receiver.url, "gateway_engine_peer_inflight") == 0, timeout=5)


def user(c: int, turn: int) -> dict[str, str]:
    return {"role": "user", "content": f"Conversation {c}, question {turn}: " + f"tell me about topic {c}.{turn} " * 12}


def other_traffic(gateway: Proc, preamble: str = PREAMBLE) -> str:
    """A prompt that shares the preamble with every conversation, and nothing more."""
    return ask(gateway, [{"role": "system", "content": preamble + "Other work " * 40}, user(999, 0)])


def conversation(c: int, preamble: str = PREAMBLE) -> list[dict[str, str]]:
    return [{"role": "system", "content": preamble + f"You help with conversation {c}. " * 12}]


def test_turns_alternating_between_replicas_stay_on_one_engine(procs, tmp_path_factory, engines, redis_server):
    a, b = replicas(procs, tmp_path_factory.mktemp("sharing"), engines, redis_server.url, share=True)
    before = applied(a)
    other_traffic(b)
    heard(a, before)
    for c in range(3):
        messages = conversation(c)
        places = []
        for turn, (here, there) in enumerate([(a, b), (b, a), (a, b), (b, a)]):
            messages.append(user(c, turn))
            before = applied(there)
            places.append(ask(here, messages))
            heard(there, before)
            messages.append({"role": "assistant", "content": f"answer {turn} " * 10})
        assert len(set(places)) == 1, places


def test_without_sharing_the_other_replica_pulls_the_next_turn_away(procs, tmp_path_factory, engines, redis_server):
    """The defect sharing removes: replica b knows only that an engine holds the shared preamble."""
    a, b = replicas(procs, tmp_path_factory.mktemp("alone"), engines, redis_server.url, share=False)
    for attempt in range(12):
        # A preamble of its own per attempt: what a routed in an earlier attempt pulls nothing here.
        preamble = f"<|system|> Be brief ({attempt}). " * 8
        elsewhere = other_traffic(b, preamble)
        messages = [*conversation(100 + attempt, preamble), user(100 + attempt, 0)]
        if ask(a, messages) == elsewhere:
            continue  # this conversation's own engine is the other traffic's: nothing to pull
        messages += [{"role": "assistant", "content": "answer 0 " * 10}, user(100 + attempt, 1)]
        assert ask(b, messages) == elsewhere
        return
    pytest.fail("every conversation went where the other traffic went")


def test_a_redis_outage_leaves_each_replica_routing_on_its_own(procs, tmp_path_factory, engines, redis_server):
    a, b = replicas(procs, tmp_path_factory.mktemp("outage"), engines, redis_server.url, share=True)
    # A conversation under way when Redis goes: its first turn through a, heard by b.
    before_outage = [*conversation(200), user(200, 0)]
    before = applied(b)
    first = ask(a, before_outage)
    heard(b, before)
    redis_server.kill()
    for gateway in (a, b):
        assert wait_for(lambda g=gateway: metric(g.url, "gateway_routing_share_up") == 0, timeout=10), gateway.log()
    # Every turn is still served; b learned the first turn before the outage and still routes by it.
    before_outage += [{"role": "assistant", "content": "answer 0 " * 10}, user(200, 1)]
    assert ask(b, before_outage) == first
    for c in range(201, 204):
        messages = [*conversation(c), user(c, 0)]
        ask(a, messages)
        messages += [{"role": "assistant", "content": "answer 0 " * 10}, user(c, 1)]
        ask(b, messages)
    for gateway in (a, b):
        log = gateway.log_path.read_text()
        assert "event=routing_share_lost" in log
        assert "routing on this replica's own knowledge" in log
        assert metric(gateway.url, "gateway_routing_share_batches_total", event="dropped") > 0
    redis_server.start()
    for gateway in (a, b):
        assert wait_for(lambda g=gateway: metric(g.url, "gateway_routing_share_up") == 1, timeout=15), gateway.log()
        assert wait_for(lambda g=gateway: "event=routing_share_resumed" in g.log_path.read_text(), timeout=5)
    # Sharing is back: turns split between the replicas stay together again.
    messages = [*conversation(300), user(300, 0)]
    before = applied(b)
    first = ask(a, messages)
    heard(b, before)
    messages += [{"role": "assistant", "content": "answer 0 " * 10}, user(300, 1)]
    assert ask(b, messages) == first


def signed_pair(procs, tmp, engines: list[Proc], redis_url: str, secrets: tuple[str, str]) -> tuple[Proc, Proc]:
    pair = []
    for secret in secrets:
        config = {
            "pools": {"interactive": {"engines": [e.url for e in engines]}},
            "store": redis_url,
            "fleet": {"channel": "gateway:signed", "secret": secret},
        }
        pair.append(start_gateway(tmp, config))
    procs.extend(pair)
    for gateway in pair:
        gateway.wait_ready("/ready")
    return pair[0], pair[1]


def test_replicas_with_the_fleets_secret_hear_each_other_and_a_forger_is_refused(
    procs, tmp_path_factory, engines, redis_server
):
    a, b = signed_pair(procs, tmp_path_factory.mktemp("signed"), engines, redis_server.url, ("s" * 32, "s" * 32))
    for gateway in (a, b):
        assert wait_for(lambda g=gateway: metric(g.url, "gateway_routing_share_peers") == 1, timeout=10), gateway.log()
    # Anyone who can publish on the channel, but without the secret: a replica claiming 65,536 requests
    # in flight on every engine (what once made every interactive request a 429 on every replica).
    import redis

    from priority_gateway.core.fleet.wire import MAX_REQUESTS, Batch, EngineReport, Report, encode

    forged = Report(engines={e.url: EngineReport(inflight=MAX_REQUESTS) for e in engines}, full=True)
    client = redis.Redis.from_url(redis_server.url)
    client.publish("gateway:signed", encode(Batch(b"f" * 16, 1, 0.0, 64, forged)))
    client.publish("gateway:signed", encode(Batch(b"f" * 16, 2, 0.0, 64, forged), b"not the fleet's secret"))
    client.close()
    for gateway in (a, b):
        assert wait_for(
            lambda g=gateway: metric(g.url, "gateway_routing_share_batches_total", event="rejected") >= 2, timeout=5
        )
        assert metric(gateway.url, "gateway_engine_peer_inflight") == 0
        assert "unsigned batch" in gateway.log_path.read_text()
    assert other_traffic(a)  # still served


def test_replicas_with_different_secrets_do_not_hear_each_other_and_say_so(
    procs, tmp_path_factory, engines, redis_server
):
    a, b = signed_pair(procs, tmp_path_factory.mktemp("mixed"), engines, redis_server.url, ("a" * 32, "b" * 32))
    for gateway in (a, b):
        assert wait_for(lambda g=gateway: "bad signature" in g.log_path.read_text(), timeout=10), gateway.log()
        assert metric(gateway.url, "gateway_routing_share_peers") == 0


def test_a_previous_versions_batches_are_refused_with_the_reason(procs, tmp_path_factory, engines, redis_server):
    """A rolling upgrade: the last version's replicas publish routing batches of format 4 and tenant
    batches that begin with 0x54 on the same channel; this version hears neither and says why (and
    the last version refuses this one's format 5 as unknown, as it refuses any format but its own)."""
    gateway, _ = replicas(procs, tmp_path_factory.mktemp("upgrade"), engines, redis_server.url, share=True)
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.publish("gateway:routing", b"\x04" + bytes(60))
    client.publish("gateway:routing", b"\x54\x01" + bytes(40))
    client.close()
    assert wait_for(lambda: "previous version" in gateway.log_path.read_text(), timeout=5), gateway.log()
    assert metric(gateway.url, "gateway_routing_share_batches_total", event="rejected") >= 2


def test_the_sections_older_place_is_still_read_with_one_warning(procs, tmp_path_factory, engines, redis_server):
    config = {
        "pools": {"interactive": {"engines": [e.url for e in engines]}},
        "store": redis_server.url,
        "prefix": {"share": {"channel": "gateway:older"}},
    }
    gateway = start_gateway(tmp_path_factory.mktemp("older"), config)
    procs.append(gateway)
    gateway.wait_ready("/ready")
    assert wait_for(lambda: metric(gateway.url, "gateway_routing_share_up") == 1), gateway.log()
    log = gateway.log_path.read_text()
    assert log.count("event=config_key_moved") == 1 and "key=prefix.share" in log and "now=fleet" in log
    assert "channel=gateway:older" in log
