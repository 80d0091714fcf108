"""What gateway bench sends: prompt lengths, uniqueness, shared prefixes, trace text."""

from __future__ import annotations

from priority_gateway.bench.workload import (
    FIRST_ORDINARY_ID,
    SyntheticWorkload,
    TokenIds,
    load_arrivals,
    trace_prompt,
    trace_token_ids,
)
from priority_gateway.simulate.traces import TRACE_BLOCK_TOKENS, TraceRequest, scale_blocks

BLOCK_CHARS = 64


def test_lengths_stay_within_the_spread():
    workload = SyntheticWorkload(500, 100, spread=0.25, seed=3)
    specs = [workload.next() for _ in range(200)]
    assert all(375 * 4 <= len(s.prompt) <= 625 * 4 for s in specs)
    assert all(75 <= s.output_len <= 125 for s in specs)
    assert len({s.output_len for s in specs}) > 10


def test_same_seed_same_requests_other_seed_other_requests():
    def first(seed):
        workload = SyntheticWorkload(300, 50, seed=seed)
        return [workload.next() for _ in range(5)]

    assert first(1) == first(1)
    assert first(1) != first(2)


def test_prompts_differ_from_their_first_block():
    workload = SyntheticWorkload(400, 10)
    heads = [workload.next().prompt[:BLOCK_CHARS] for _ in range(100)]
    assert len(set(heads)) == 100


def test_tags_keep_runs_apart():
    a = SyntheticWorkload(400, 10, tag="run1").next().prompt
    b = SyntheticWorkload(400, 10, tag="run2").next().prompt
    assert a[:BLOCK_CHARS] != b[:BLOCK_CHARS]
    assert len(a) == len(b)


def test_shared_prefix_is_common_then_prompts_differ():
    workload = SyntheticWorkload(1000, 10, shared_prefix_len=600)
    a, b = workload.next().prompt, workload.next().prompt
    assert a[: 600 * 4] == b[: 600 * 4]
    assert a[600 * 4 : 600 * 4 + BLOCK_CHARS] != b[600 * 4 : 600 * 4 + BLOCK_CHARS]


def test_trace_prompt_covers_the_whole_length_and_shares_equal_blocks():
    a = TraceRequest(0.0, 1200, 10, (7, 8, 9))
    b = TraceRequest(1.0, 1100, 10, (7, 8, 5))
    pa, pb = trace_prompt(a), trace_prompt(b)
    assert len(pa) == 1200 * 4 and len(pb) == 1100 * 4
    shared = 2 * TRACE_BLOCK_TOKENS * 4
    assert pa[:shared] == pb[:shared]
    assert pa[shared : shared + BLOCK_CHARS] != pb[shared : shared + BLOCK_CHARS]
    assert pa[:BLOCK_CHARS] == a.text()[:BLOCK_CHARS]
    ta, tb = trace_prompt(a, "run1"), trace_prompt(b, "run1")
    assert len(ta) == len(pa) and ta.startswith("[run1] ")
    assert ta[:shared] == tb[:shared] and ta[shared : shared + BLOCK_CHARS] != tb[shared : shared + BLOCK_CHARS]
    assert trace_prompt(a, "run2")[:BLOCK_CHARS] != ta[:BLOCK_CHARS]


def test_arrivals_scaled_cut_and_classed(tmp_path):
    trace = tmp_path / "t.csv"
    rows = [f"2023-11-16 18:15:{10 + 2 * i:02d}.0000000,{100 + i},{5 + i}" for i in range(10)]
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    arrivals = load_arrivals([f"{trace}@batch"], rate_scale=2.0, duration=5.0)
    assert [a.arrival for a in arrivals] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert {a.cls for a in arrivals} == {"batch"}
    assert {a.group for a in arrivals} == {"t@batch"}
    assert [a.spec().output_len for a in arrivals] == [5, 6, 7, 8, 9]
    assert load_arrivals([str(trace)], x_priority="interactive")[0].cls == "interactive"
    assert load_arrivals([str(trace)])[0].cls is None


def test_token_id_trace_prompts_have_exact_lengths_and_share_equal_blocks():
    ids = TokenIds(32000)
    a = TraceRequest(0.0, 1200, 10, (7, 8, 9))
    b = TraceRequest(1.0, 1100, 10, (7, 8, 5))
    pa, pb = trace_token_ids(a, ids, "run1"), trace_token_ids(b, ids, "run1")
    assert len(pa) == 1200 and len(pb) == 1100
    assert all(FIRST_ORDINARY_ID <= t < 32000 for t in pa + pb)
    shared = 2 * TRACE_BLOCK_TOKENS
    assert pa[:shared] == pb[:shared]
    assert pa[shared : shared + 16] != pb[shared : shared + 16]
    assert trace_token_ids(a, ids, "run2")[:16] != pa[:16]  # another run: another cache


def test_scaled_blocks_shrink_prompts_and_keep_what_is_shared():
    ids = TokenIds(32000)
    a, b = scale_blocks([TraceRequest(0.0, 1200, 10, (7, 8, 9)), TraceRequest(1.0, 1100, 10, (7, 8, 5))], 128)
    assert (a.input_len, b.input_len) == (300, 275)
    pa, pb = trace_token_ids(a, ids), trace_token_ids(b, ids)
    assert len(pa) == 300 and len(pb) == 275
    assert pa[:256] == pb[:256] and pa[256:272] != pb[256:272]


def test_token_id_synthetic_prompts_share_only_the_shared_prefix():
    workload = SyntheticWorkload(300, 10, spread=0.0, shared_prefix_len=64, tag="t", token_ids=TokenIds(32000))
    a, b = workload.next().prompt, workload.next().prompt
    assert isinstance(a, list) and len(a) == len(b) == 300
    assert a[:64] == b[:64] and a[64:80] != b[64:80]
