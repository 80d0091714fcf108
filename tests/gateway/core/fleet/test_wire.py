"""The one batch format: what goes out comes back, what cannot be (damaged, implausible, forged, of another
version) is refused whole with a reason."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from priority_gateway.core.fleet.wire import (
    MAX_NAME_BYTES,
    MAX_REQUESTS,
    Batch,
    EngineReport,
    Report,
    TenantShare,
    WireError,
    decode,
    encode,
)
from priority_gateway.core.limiter import Evidence, LevelCounts
from priority_gateway.core.routing import RoutedBlocks
from tests.support.examples import examples

ENGINES = [f"http://e{i}:8000" for i in range(4)]
P = b"p" * 16

fact = st.builds(
    RoutedBlocks,
    st.sampled_from([*ENGINES, "http://[::1]:9000", "http://é:1"]),
    st.lists(st.integers(min_value=0, max_value=2**64 - 1), max_size=300).map(tuple),
    st.integers(min_value=0, max_value=2**32 - 1),
    st.integers(min_value=1, max_value=2**16 - 1),
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
evidence = st.builds(
    lambda over, far, rest, levels: Evidence(max(over, far) + rest, over, far, levels),
    counts,
    counts,
    counts,
    st.dictionaries(st.integers(1, 0xFFFF), level_counts, max_size=8),
)
requests = st.integers(0, MAX_REQUESTS)
reports = st.dictionaries(
    st.sampled_from(ENGINES),
    st.builds(
        EngineReport,
        requests,
        st.integers(0, 2**32 - 1),
        st.sampled_from([0.0, 1.0, 2.5, 64.0]),
        requests,
        requests,
        requests,
        st.integers(0, 2**32 - 1),
        st.none() | evidence,
        st.lists(st.text(min_size=1, max_size=20), max_size=3).map(tuple),
    ),
)
names = st.text(min_size=0, max_size=20)
tenants = st.dictionaries(
    st.tuples(names, names),
    st.builds(TenantShare, requests, requests, st.sampled_from([0.5, 1.0, 2.0, 3.0])),
    max_size=20,
)


@settings(max_examples=examples(150), deadline=None)
@given(st.lists(fact, max_size=20), reports, tenants, st.booleans(), st.integers(0, 2**64 - 1), st.booleans())
def test_a_batch_comes_back_as_it_was_sent(facts, engines, told, full, sequence, signed):
    secret = b"s3cret" if signed else None
    batch = Batch(P, sequence, 1234.5, 64, Report(facts, engines, told, full))
    assert decode(encode(batch, secret), secret) == batch


def test_evidence_that_cannot_be_is_refused():
    good = Evidence(10, 2, 1, {3: LevelCounts(10, 2, 8, 50, 49)})
    raw = encode(Batch(P, 1, 0.0, 64, Report(engines={ENGINES[0]: EngineReport(evidence=good)})))
    assert decode(raw).report.engines[ENGINES[0]].evidence == good
    level_at = len(raw) - struct.calcsize("<I") - struct.calcsize("<HIIIII")
    tail = raw[-struct.calcsize("<I") :]
    for bad in (
        struct.pack("<HIIIII", 0, 10, 2, 8, 50, 49),  # no level 0
        struct.pack("<HIIIII", 3, 10, 3, 8, 50, 49),  # more over and within than gaps
        struct.pack("<HIIIII", 3, 10, 2, 8, 50, 51),  # more within than gaps
    ):
        with pytest.raises(WireError, match="evidence"):
            decode(raw[:level_at] + bad + tail)


def test_a_forged_count_no_replica_could_have_is_refused_whole():
    """A peer claiming 2^32-1 requests in flight once made every interactive request a 429 on every
    replica: a batch with a count past what any replica runs is broken or forged."""
    raw = encode(Batch(P, 1, 0.0, 64, Report(engines={ENGINES[0]: EngineReport(inflight=3)})))
    at = raw.index(struct.pack("<I", 3))
    forged = raw[:at] + struct.pack("<I", 2**32 - 1) + raw[at + 4 :]
    with pytest.raises(WireError, match="implausible"):
        decode(forged)
    # What a replica would send past the bounds goes out clamped, so it still decodes.
    big = Batch(P, 1, 0.0, 64, Report(engines={ENGINES[0]: EngineReport(inflight=10**12, limit=1e9, kv_held=10**15)}))
    assert decode(encode(big)).report.engines[ENGINES[0]] == EngineReport(
        inflight=MAX_REQUESTS, limit=MAX_REQUESTS, kv_held=2**32 - 1
    )


def test_with_a_secret_only_batches_signed_with_it_are_heard():
    batch = Batch(P, 1, 0.0, 64, Report(engines={ENGINES[0]: EngineReport(inflight=1)}))
    signed = encode(batch, b"fleet secret")
    assert decode(signed, b"fleet secret") == batch
    with pytest.raises(WireError, match="bad signature"):
        decode(signed, b"another secret")
    with pytest.raises(WireError, match="unsigned"):
        decode(encode(batch), b"fleet secret")
    with pytest.raises(WireError, match="signed batch"):
        decode(signed)
    tampered = bytearray(signed)
    tampered[40] ^= 1
    with pytest.raises(WireError, match="bad signature"):
        decode(bytes(tampered), b"fleet secret")


def test_the_previous_versions_batches_are_named_and_refused():
    """A rolling upgrade: replicas of the last version send routing batches of format 4 and tenant
    batches beginning 0x54; this version refuses both and says what they are (and the last version
    refuses ours as an unknown format)."""
    raw = encode(Batch(P, 1, 0.0, 64, Report()))
    with pytest.raises(WireError, match=r"previous version.*format 4"):
        decode(b"\x04" + raw[1:])
    with pytest.raises(WireError, match="tenant batch of the previous version"):
        decode(b"\x54" + raw[1:])
    with pytest.raises(WireError, match="unknown format 9"):
        decode(b"\x09" + raw[1:])
    with pytest.raises(WireError, match="empty"):
        decode(b"")


def test_a_tenant_name_too_long_to_share_is_left_out_not_cut():
    long = "t" * (MAX_NAME_BYTES + 1)
    told = {("p", long): TenantShare(1), ("p", "short"): TenantShare(2)}
    assert decode(encode(Batch(P, 1, 0.0, 64, Report(tenants=told)))).report.tenants == {("p", "short"): TenantShare(2)}


def test_a_tenant_weight_that_cannot_be_is_refused():
    good = encode(Batch(P, 1, 0.0, 64, Report(tenants={("p", "t"): TenantShare(1, 2, 1.0)})))
    with pytest.raises(WireError, match="tenant"):
        decode(good[:-4] + struct.pack("<f", 0.0))


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(fact, min_size=1, max_size=4), reports, st.data())
def test_a_damaged_batch_is_refused_with_a_wire_error(facts, engines, data):
    raw = encode(Batch(P, 1, 0.0, 64, Report(facts, engines)))
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(WireError):
        decode(raw[:cut])
    noise = data.draw(st.binary(max_size=200))
    with contextlib.suppress(WireError):
        decode(noise)


def test_trailing_bytes_and_bad_ids_are_refused():
    raw = encode(Batch(P, 1, 0.0, 64, Report()))
    with pytest.raises(WireError, match="trailing"):
        decode(raw + b"\0")
    with pytest.raises(ValueError):
        encode(Batch(b"short", 1, 0.0, 64, Report()))
