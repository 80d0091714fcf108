"""The prefill prediction (``core/prefill.py``) and what the prefix policy and the dispatcher do with it:
a long uncached prompt goes where its prefill breaks no decoder's ITL budget, is held while none can
take it, and a held request never stops backfilled work."""

from __future__ import annotations

import yaml

from priority_gateway.core.classes import BATCH, INTERACTIVE, Budget
from priority_gateway.core.dispatcher import AdmissionSettings, Dispatch, Dispatcher, PoolSpec, Preempted, Queued
from priority_gateway.core.engines import EngineState
from priority_gateway.core.limiter import LimitSettings
from priority_gateway.core.prefill import PrefillModel, StepModel
from priority_gateway.core.prefix_policy import PrefixAffinity
from priority_gateway.core.request import RouteRequest
from tests.support.procs import ROOT

SLO = Budget(ttft_s=0.5, itl_s=0.05)
H200 = ROOT / "engines" / "sim" / "profiles" / "h200-7b-bf16.yaml"


def test_the_step_model_is_the_fit_the_simulator_profile_carries():
    """One fit, two users: the core's defaults are the H200 profile's timing (refit both or neither)."""
    timing = yaml.safe_load(H200.read_text())["timing"]
    step = StepModel()
    for name in (
        "overhead_ms",
        "per_seq_ms",
        "host_ms_per_prefill_token",
        "prefill_ms_per_token",
        "prefill_ms_per_ktoken2",
        "prefill_attention_ms_per_mpair",
        "weights_ms",
        "host_overlaps_device",
    ):
        assert getattr(step, name) == timing[name], name
    # What the fit says of mixed steps on the H200 (the profile's notes): 8192 tokens ~174 ms, 4096
    # ~74 ms, 2048 ~29 ms beside decoders, and 256 tokens within a plain step.
    plain = step.step_ms(0, 16)
    assert 160 < step.step_ms(8192, 17, 8192 * 4096) < 190
    assert 65 < step.step_ms(4096, 17, 4096 * 2048) < 85
    assert 25 < step.step_ms(2048, 17, 2048 * 1024) < 35
    assert step.step_ms(256, 17, 256 * 128) - plain < 2


def test_chunked_prefill_spreads_a_long_prompt_over_steps_within_budget():
    model = PrefillModel(chunk_tokens=384)
    stall = model.predict(8192, 0, requests=20, budgeted=20, queued=0, itl_s=0.05)
    assert stall.own_steps == -(-8192 // (384 - 20)) == stall.steps_to_first_token
    assert stall.over_budget_steps == stall.harmed_gaps == 0
    assert 0.2 < stall.first_token_s < 0.5


def test_a_whole_long_prefill_in_one_step_breaks_a_gap_of_every_budgeted_decoder():
    model = PrefillModel(chunk_tokens=8192)
    stall = model.predict(8192, 0, requests=20, budgeted=12, queued=0, itl_s=0.05)
    assert stall.over_budget_steps == 1
    assert stall.harmed_gaps == 12  # the 8 batch requests beside them have no ITL budget to break
    assert stall.extra_ms > 100
    cached = model.predict(512, 7680, requests=20, budgeted=12, queued=0, itl_s=0.05)
    assert cached.harmed_gaps == 0  # the same prompt mostly cached: its remainder fits a step


def test_prefill_queued_ahead_delays_the_first_token_but_is_someone_elses_stall():
    model = PrefillModel(chunk_tokens=384)
    alone = model.predict(1024, 0, requests=4, budgeted=4, queued=0, itl_s=0.05)
    behind = model.predict(1024, 0, requests=4, budgeted=4, queued=4000, itl_s=0.05)
    assert behind.first_token_s > alone.first_token_s + 0.1
    assert behind.own_steps - alone.own_steps <= 1  # the queue's tail may share its first step
    assert behind.steps_to_first_token > alone.steps_to_first_token + 9


def test_a_request_is_held_only_while_it_can_still_make_its_first_token_in_time():
    model = PrefillModel(chunk_tokens=8192, max_hold_s=0.2)
    stall = model.predict(8192, 0, requests=10, budgeted=10, queued=0, itl_s=0.05)
    assert model.hold(stall, age_s=0.0, ttft_left_s=0.5)
    assert not model.hold(stall, age_s=0.2, ttft_left_s=0.3)  # held long enough
    assert not model.hold(stall, age_s=0.1, ttft_left_s=stall.first_token_s)  # no time left to wait
    harmless = model.predict(512, 0, requests=10, budgeted=10, queued=0, itl_s=0.05)
    assert not model.hold(harmless, age_s=0.0, ttft_left_s=0.5)
    assert not PrefillModel(chunk_tokens=8192).hold(stall, age_s=0.0, ttft_left_s=0.5)  # 0 never holds


def make(hold_s=0.0, chunk=8192, limit=8.0, interactive_engines=2):
    settings = AdmissionSettings(
        enabled=True, limits=LimitSettings(initial=limit, unbudgeted=limit), backfill_reserve=0.0
    )
    options = {"prefill_chunk_tokens": chunk, "prefill_hold_s": hold_s}
    engines = [f"i{n}" for n in range(interactive_engines)]
    pools = [
        PoolSpec("interactive", engines, policy="prefix", policy_options=options),
        PoolSpec("batch", ["b0"], policy="least_loaded", takes_priority=True),
    ]
    return Dispatcher(pools, budgets={INTERACTIVE: 0.05, BATCH: None}, admission=settings)


counter = iter(range(10**6))


def req(prompt_tokens=100, now=0.0, cls=INTERACTIVE, budget=SLO):
    return RouteRequest(
        f"r{next(counter)}", cls, "m", now, prompt_tokens=prompt_tokens, budget=budget, restartable=True
    )


def engine(name: str, interactive: int = 0, batch: int = 0) -> EngineState:
    state = EngineState(name, "interactive")
    state.inflight = interactive + batch
    state.inflight_by_class = {INTERACTIVE: interactive, BATCH: batch}
    return state


def test_a_long_uncached_prompt_goes_where_no_budgeted_decoder_waits_behind_it():
    busy, batch_only = engine("i0", interactive=3), engine("i1", batch=4)
    policy = PrefixAffinity(prefill_chunk_tokens=8192)
    choice = policy.choose(req(8192), [busy, batch_only], 0.1)
    assert choice is not None and choice.engine is batch_only
    assert policy.prefill_steered == 1
    # A short prompt breaks nobody's budget: the policy's own cost decides (fewer requests in flight).
    assert policy.choose(req(512), [busy, batch_only], 0.1).engine is busy  # type: ignore[union-attr]
    # Without the prediction the long prompt goes by that cost too, onto the three decoders.
    assert PrefixAffinity().choose(req(8192), [busy, batch_only], 0.1).engine is busy  # type: ignore[union-attr]
    # With the engines' 384-token chunks no step breaks the budget: nothing is steered.
    chunked = PrefixAffinity(prefill_chunk_tokens=384)
    assert chunked.choose(req(8192), [busy, batch_only], 0.1).engine is busy  # type: ignore[union-attr]
    assert chunked.prefill_steered == 0


def test_held_while_every_engine_has_decoders_then_placed_where_it_breaks_fewest():
    policy = PrefixAffinity(prefill_chunk_tokens=8192, prefill_hold_s=0.2)
    three, one = engine("i0", interactive=3), engine("i1", interactive=1)
    long = req(8192, now=0.0)
    assert policy.choose(long, [three, one], 0.0) is None
    assert policy.holds(long) and not policy.holds(req(8192))
    assert policy.choose(long, [three, one], 0.15) is None
    placed = policy.choose(long, [three, one], 0.2)
    assert placed is not None and placed.engine is one and not policy.holds(long)
    # Held in the dispatcher: queued, and started by a later poll once held long enough.
    d = make(hold_s=0.2)
    for _ in range(4):
        d.submit(req(), 0.0)
    waiting = d.submit(req(8192, now=0.0), 0.0).answer
    assert isinstance(waiting, Queued)
    assert d.poll(0.1).others == []
    (started,) = [n for n in d.poll(0.25).others if isinstance(n, Dispatch)]
    assert started.request is waiting.request


def test_a_held_request_does_not_stop_backfilled_batch_work():
    """Stopping a backfilled request frees a slot, but the held prompt would stall the same decoders:
    the dispatcher asks the policy (``holds``) before preempting."""
    d = make(hold_s=0.2, limit=4.0, interactive_engines=1)
    assert isinstance(d.submit(req(), 0.0).answer, Dispatch)
    started = [d.submit(req(cls=BATCH, budget=Budget()), 0.0).answer for _ in range(6)]
    assert [s.reason for s in started if isinstance(s, Dispatch)].count("backfill") == 2
    decided = d.submit(req(8192), 0.0)
    assert isinstance(decided.answer, Queued)
    assert not any(isinstance(n, Preempted) for n in decided.others)
