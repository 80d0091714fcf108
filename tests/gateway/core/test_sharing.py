"""What replicas tell each other: the wire format, the peer table, and two dispatchers that share."""

import contextlib
import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from priority_gateway.core.dispatcher import Dispatch, Dispatcher, PoolSpec
from priority_gateway.core.engines import EngineMetrics
from priority_gateway.core.limiter import Evidence, LevelCounts
from priority_gateway.core.prefix import chain_seed, estimate_tokens, hash_blocks
from priority_gateway.core.request import RouteRequest
from priority_gateway.core.sharing import Batch, EngineLoad, Learned, Peers, RoutedBlocks, decode, encode

ENGINES = [f"http://e{i}:8000" for i in range(4)]
SYSTEM = "<system> You answer questions about the shared handbook. " * 20


def request(rid: str, text: str) -> RouteRequest:
    return RouteRequest(
        rid, "interactive", "m", 0.0, prompt_tokens=estimate_tokens(text), prefix=hash_blocks(text, chain_seed("m"))
    )


def turns(c: int, n: int) -> str:
    return SYSTEM + "".join(f"<user {c} turn {t}> " + f"words of conversation {c} " * 12 for t in range(n))


def replica(share: bool = True, **options: object) -> Dispatcher:
    d = Dispatcher([PoolSpec("interactive", ENGINES, policy="prefix", policy_options=options)])
    if share:
        d.share_learning()
    return d


class Channel:
    """Batches from one replica to another, numbered as a publisher numbers them."""

    def __init__(self, name: bytes) -> None:
        self.publisher = name.ljust(16, b"\0")
        self.sequence = 0

    def batch(self, learned: Learned) -> Batch:
        self.sequence += 1
        return Batch(self.publisher, self.sequence, 0.0, 64, learned)


def route(d: Dispatcher, rid: str, text: str) -> str:
    out = d.submit(request(rid, text), 0.0).answer
    assert isinstance(out, Dispatch)
    d.finish(out, 0.0)
    return out.engine.id


def test_turns_split_between_replicas_stay_on_one_engine_once_they_share():
    """Replica a has the system prompt on every engine (a busy moment spread it), so it places each
    conversation by its own text; replica b has seen the system prompt on one engine only. Without
    a's facts, b's partial match pulls the conversations' next turns there; with them each stays
    where a put it."""
    for share in (False, True):
        a, b = replica(load_factor=1.0), replica(load_factor=1.0)
        channel = Channel(b"a")
        busy = [a.submit(request(f"w{i}", SYSTEM + f"<user warm {i}> hello " * 10), 0.0).answer for i in range(8)]
        for out in busy:
            a.finish(out, 0.0)
        route(b, "b", SYSTEM + "<user other> a question of its own " * 10)
        a.take_learned(), b.take_learned()  # only what a routes from here on is shared
        moved = 0
        for c in range(20):
            where = route(a, f"a{c}", turns(c, 1))
            if share:
                b.learn(channel.batch(a.take_learned()), 0.0)
            moved += route(b, f"b-turn2-{c}", turns(c, 2)) != where
            b.take_learned()
        if share:
            assert moved == 0
        else:
            assert moved > 0  # the defect sharing removes: the test can tell the two apart


def test_a_fact_applied_twice_or_late_changes_no_choice():
    a, b, c = replica(), replica(), replica()
    channel = Channel(b"a")
    for i in range(12):
        route(a, f"a{i}", turns(i, 2))
    batch = channel.batch(a.take_learned())
    assert b.learn(batch, 0.0) == (12, 0)
    assert c.learn(batch, 0.0) == (12, 0)
    assert b.learn(batch, 1.0) == (12, 0)  # a duplicate: nothing counted missing
    for i in range(12):
        assert route(b, f"b{i}", turns(i, 3)) == route(c, f"c{i}", turns(i, 3))


def test_facts_about_unknown_engines_are_ignored():
    b = replica()
    fact = RoutedBlocks("http://elsewhere:8000", tuple(range(50)), 800, 16)
    applied, _ = b.learn(Channel(b"a").batch(Learned([fact], {"http://elsewhere:8000": EngineLoad(5, 100)})), 0.0)
    assert applied == 0
    policy = b.pools["interactive"].policy
    assert "http://elsewhere:8000" not in policy.index._bit
    assert b.peers.inflight("http://elsewhere:8000") == 0


@settings(max_examples=20, deadline=None)
@given(st.integers(min_value=0, max_value=2**32))
def test_memory_stays_bounded_whatever_arrives(seed):
    rng = random.Random(seed)
    b = replica(default_capacity_tokens=4096)
    channel = Channel(b"a")
    for _ in range(40):
        facts = [
            RoutedBlocks(rng.choice(ENGINES), tuple(rng.getrandbits(64) for _ in range(rng.randint(1, 64))), 2048, 16)
            for _ in range(rng.randint(1, 20))
        ]
        b.learn(channel.batch(Learned(facts)), 0.0)
    index = b.pools["interactive"].policy.index
    for engine in ENGINES:
        assert index.used(engine) <= index.capacity(engine)
    assert sum(len(lru) for lru in index._lru.values()) <= 4 * 4096 // 16


def test_peers_are_bounded_and_the_least_recent_is_forgotten_first():
    peers = Peers(max_peers=3)
    for i in range(5):
        peers.heard(bytes([i]) * 16, 1, float(i))
        peers.report(bytes([i]) * 16, {"e": EngineLoad(1, 10)}, full=True)
    assert peers.active(10.0, 100.0) == 3
    assert peers.inflight("e") == 3 and peers.prefill("e") == 30


def test_the_outbox_keeps_the_newest_facts_when_nobody_takes_them():
    a = Dispatcher([PoolSpec("interactive", ENGINES, policy="prefix")])
    a.share_learning(max_pending=5)
    for i in range(8):
        route(a, f"a{i}", turns(i, 1))
    facts = a.take_learned().facts
    assert len(facts) == 5
    assert a.pools["interactive"].policy.learned_dropped == 3
    assert [f.prompt_tokens for f in facts] == [estimate_tokens(turns(i, 1)) for i in range(3, 8)]


# -- load ---------------------------------------------------------------------------------------


def test_other_replicas_requests_count_as_load_until_they_finish():
    a, b = replica(), replica()
    channel = Channel(b"a")
    out = a.submit(request("r", turns(1, 3)), 0.0).answer
    assert isinstance(out, Dispatch)
    b.learn(channel.batch(a.take_learned()), 0.0)
    seen = b.engine(out.engine.id)
    assert seen.peer_inflight == 1 and seen.load == 1
    assert seen.peer_prefill == out.prefill_tokens > 0
    a.observe_ttft(out, 0.5, 0.5)  # its first token: no prefill pending any more
    b.learn(channel.batch(a.take_learned()), 0.5)
    assert seen.peer_prefill == 0 and seen.peer_inflight == 1
    a.finish(out, 1.0)
    b.learn(channel.batch(a.take_learned()), 1.0)
    assert seen.load == 0


def test_a_full_report_corrects_what_was_lost_and_silence_forgets():
    a, b = replica(), replica()
    channel = Channel(b"a")
    b.learn(channel.batch(a.take_learned(full=True)), 0.0)
    outs = [a.submit(request(f"r{i}", turns(i, 2)), 0.0).answer for i in range(4)]
    lost = a.take_learned()  # this batch never arrives
    channel.sequence += 1
    for out in outs[:2]:
        a.finish(out, 1.0)
    a.take_learned()
    channel.sequence += 1
    _, missed = b.learn(channel.batch(a.take_learned(full=True)), 2.0)
    assert missed == 2
    assert sum(b.engine(e).peer_inflight for e in ENGINES) == 2
    assert {e for e in ENGINES if b.engine(e).peer_inflight} == {o.engine.id for o in outs[2:]}
    assert lost.load  # what the lost batch said is superseded, not needed
    b.expire_peers(10.0, silent_s=3.0)
    assert all(b.engine(e).peer_inflight == 0 and b.engine(e).peer_prefill == 0 for e in ENGINES)


def test_losing_the_channel_keeps_what_the_others_ran_only_until_the_engines_say_otherwise():
    a, b = replica(), replica()
    channel = Channel(b"a")
    out = a.submit(request("r", turns(1, 2)), 0.0).answer
    b.learn(channel.batch(a.take_learned()), 0.0)
    assert sum(b.engine(e).load for e in ENGINES) == 1
    b.lost_peers()
    assert all(b.engine(e).peer_inflight == 0 for e in ENGINES)
    assert sum(b.engine(e).load for e in ENGINES) == 1  # a's request still runs, as far as b knows
    seen = b.engine(out.engine.id)
    seen.mark_scrape_start()
    b.apply_scrape(out.engine.id, EngineMetrics(running=0, waiting=0), 1.0)  # it has ended
    assert sum(b.engine(e).load for e in ENGINES) == 0


def test_a_scrape_does_not_count_other_replicas_requests_twice():
    a, b = replica(), replica()
    channel = Channel(b"a")
    out = a.submit(request("r", turns(1, 2)), 0.0).answer
    b.learn(channel.batch(a.take_learned()), 0.0)
    seen = b.engine(out.engine.id)
    seen.mark_scrape_start()
    b.apply_scrape(out.engine.id, EngineMetrics(running=3, waiting=0), 1.0)  # a's request and 2 from elsewhere
    assert seen.load == 3


def test_a_replica_that_does_not_share_tells_nothing():
    a = replica(share=False)
    route(a, "r", turns(1, 2))
    assert not a.take_learned()


def test_precise_mode_shares_load_but_no_blocks():
    a = replica(precise=True)
    out = a.submit(RouteRequest("r", "interactive", "m", 0.0, prompt_tokens=100, prefix=[1, 2, 3]), 0.0).answer
    assert isinstance(out, Dispatch)
    learned = a.take_learned()
    assert learned.facts == [] and learned.load == {out.engine.id: EngineLoad(1, 100)}


# -- the wire --------------------------------------------------------------------------------------

fact = st.builds(
    RoutedBlocks,
    st.sampled_from([*ENGINES, "http://[::1]:9000", "http://é:1"]),
    st.lists(st.integers(min_value=0, max_value=2**64 - 1), max_size=300).map(tuple),
    st.integers(min_value=0, max_value=2**32 - 1),
    st.integers(min_value=1, max_value=2**16 - 1),
)
loads = st.dictionaries(
    st.sampled_from(ENGINES),
    st.builds(EngineLoad, st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)),
)

counts = st.integers(0, 2**20)
level_counts = st.builds(
    lambda over, within, rest, long_within, long_rest: LevelCounts(
        over + within + rest, over, within, long_within + long_rest, long_within
    ),
    counts,
    counts,
    counts,
    counts,
    counts,
)
evidences = st.dictionaries(
    st.sampled_from(ENGINES),
    st.builds(
        lambda over, far, rest, levels: Evidence(max(over, far) + rest, over, far, levels),
        counts,
        counts,
        counts,
        st.dictionaries(st.integers(1, 0xFFFF), level_counts, max_size=8),
    ),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(fact, max_size=20), loads, st.booleans(), st.integers(0, 2**64 - 1), evidences)
def test_a_batch_comes_back_as_it_was_sent(facts, load, full, sequence, evidence):
    batch = Batch(b"p" * 16, sequence, 1234.5, 64, Learned(facts, load, full, evidence=evidence))
    assert decode(encode(batch)) == batch


def test_evidence_that_cannot_be_is_refused():
    good = Evidence(10, 2, 1, {3: LevelCounts(10, 2, 8, 50, 49)})
    raw = encode(Batch(b"p" * 16, 1, 0.0, 64, Learned(evidence={ENGINES[0]: good})))
    assert decode(raw).learned.evidence == {ENGINES[0]: good}
    level_at = len(raw) - struct.calcsize("<HIIIII")
    for bad in (
        struct.pack("<HIIIII", 0, 10, 2, 8, 50, 49),  # no level 0
        struct.pack("<HIIIII", 3, 10, 3, 8, 50, 49),  # more over and within than gaps
        struct.pack("<HIIIII", 3, 10, 2, 8, 50, 51),  # more within than gaps
    ):
        with pytest.raises(ValueError, match="evidence"):
            decode(raw[:level_at] + bad)


@settings(max_examples=300, deadline=None)
@given(st.lists(fact, min_size=1, max_size=4), loads, st.data())
def test_a_damaged_batch_is_refused_with_value_error(facts, load, data):
    raw = encode(Batch(b"p" * 16, 1, 0.0, 64, Learned(facts, load)))
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(ValueError):
        decode(raw[:cut])
    noise = data.draw(st.binary(max_size=200))
    with contextlib.suppress(ValueError):
        decode(noise)


def test_unknown_formats_and_trailing_bytes_are_refused():
    raw = encode(Batch(b"p" * 16, 1, 0.0, 64, Learned()))
    with pytest.raises(ValueError, match="format"):
        decode(b"\x01" + raw[1:])  # the format before learned limits were shared
    with pytest.raises(ValueError, match="format"):
        decode(b"\x03" + raw[1:])  # the format before evidence was shared
    with pytest.raises(ValueError, match="trailing"):
        decode(raw + b"\0")
    with pytest.raises(ValueError):
        encode(Batch(b"short", 1, 0.0, 64, Learned()))
    assert struct.calcsize("<BB16sQdHH") < len(raw)
