import itertools
from pathlib import Path

from priority_gateway.simulate.traces import hot_prompts, load_trace, merge, parse_trace_arg, poisson

TRACES = Path(__file__).parents[3] / "benchmarks" / "traces"
MOONCAKE = TRACES / "mooncake" / "conversation_trace.jsonl"
AZURE = TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"


def test_mooncake_rows_keep_lengths_and_block_ids_and_spread_each_bucket():
    reqs = load_trace(MOONCAKE, minutes=1)
    assert reqs[0].input_len == 6758 and reqs[0].output_len == 500 and reqs[0].hash_ids[:3] == (0, 1, 2)
    assert all(0 <= r.arrival < 60 for r in reqs)
    assert len({round(r.arrival, 3) for r in reqs}) > len(reqs) * 0.9  # jittered, not 3-second bursts


def test_shared_block_ids_give_shared_text():
    reqs = load_trace(MOONCAKE, minutes=2)
    a, b = reqs[0], next(r for r in reqs[1:] if r.hash_ids[:2] != reqs[0].hash_ids[:2])
    assert a.text()[:2048] == b.text()[:2048]  # block 0 is shared by every request
    assert a.text()[2048:4096] != b.text()[2048:4096]


def test_azure_rows_are_relative_seconds_with_private_blocks():
    reqs = load_trace(AZURE, minutes=1)
    assert reqs[0].arrival == 0.0 and reqs[0].input_len == 374 and reqs[0].output_len == 44
    assert not set(reqs[0].hash_ids) & set(reqs[1].hash_ids)


def test_synthetic_traces_are_deterministic():
    spec = "poisson:rate=2,input=100,output=10,minutes=1"
    assert [r.arrival for r in poisson(spec)] == [r.arrival for r in poisson(spec)]
    assert 60 < len(poisson(spec)) < 180
    hot = hot_prompts("hot:rate=5,prompts=3,prompt_len=1024,user_len=100,output=10,minutes=1")
    assert {r.hash_ids[:2] for r in hot} <= {((1 << 45) + k * 4096, (1 << 45) + k * 4096 + 1) for k in range(3)}


def test_class_suffix_and_rate_scale():
    assert parse_trace_arg("x.csv@batch") == (Path("x.csv"), "batch")
    assert parse_trace_arg("x.csv") == (Path("x.csv"), "interactive")
    faster = merge([load_trace(AZURE, minutes=1)], rate_scale=2.0)
    assert max(r.arrival for r in faster) < 30.1


def test_agent_sessions_chain_turns_whose_prompts_carry_the_previous_context_and_reply():
    from priority_gateway.simulate.traces import SessionShapes, agent_sessions

    first = agent_sessions(5, 1.0, SessionShapes(turns=(3, 30)), seed=2)
    assert len(first) == 5 and len({t.session for t in first}) == 5
    for head in first:
        turns = [head]
        while turns[-1].next_turn is not None:
            turns.append(turns[-1].next_turn)
        assert 3 <= len(turns) <= 30
        for before, after in itertools.pairwise(turns):
            context = before.hash_ids + before.output_hash_ids
            assert after.hash_ids[: len(context)] == context  # the next prompt carries prompt and reply
            assert 200 <= after.input_len - before.input_len - before.output_len <= 4000
            assert 1.0 <= after.pause_s <= 60.0
