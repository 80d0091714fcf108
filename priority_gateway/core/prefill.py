"""What a prompt's prefill costs the requests decoding beside it, predicted before the prompt is sent.

An ITL limit learned from measured gaps counts requests, and cannot see that one long uncached
prompt joining a decode batch stalls every decoder beside it, however many there are. The gateway
knows the prompt's uncached length (its prefix index) and each engine's requests and queued
prefill, so it can predict that stall on each candidate and place the prompt where it hurts least,
or hold it while no candidate can take it within budget.

Rules:
- A step's time is the mixed-step model fitted on the H200 (``benchmarks/results/gpu/mixed_steps.json``;
  the simulator's ``h200-7b-bf16`` ``timing``): the host launches it in ``overhead + per_seq * S +
  host_per_prefill_token * P``, the device computes it in ``max(weights, a * P + b * (P / 1000) ** 2 +
  q * pairs / 1e6)``, and it takes the longer of the two when the host overlaps the device, else their
  sum (``S`` sequences in the step, ``P`` prefill tokens, ``pairs`` causal attention pairs of them).
- The engine prefills in chunks: each step gives every decoder one token and the rest of its token
  budget (``chunk_tokens``, the engines' ``--max-num-batched-tokens``) to prefills, first come first
  served. A prompt of ``U`` uncached tokens behind ``Q`` queued ones on an engine with ``D`` requests
  takes ``ceil((Q + U) / (chunk - D))`` steps to its first token, the last ``ceil(U / (chunk - D))``
  carrying its own chunks.
- Each of those own steps slows every decoder beside it by the step's time less a plain decode
  step's (``extra_ms``); one over the ITL budget breaks one gap of each decoder that has an ITL budget
  (``harmed_gaps``). Decoders without one (batch) are not harmed.
- ``rank`` orders candidates: those whose prediction keeps both budgets first (no harmed gap, first
  token within what is left of the TTFT budget), then the fewest harmed gaps, then the earliest first
  token; within one rank the caller's own order decides.
- ``hold``: when no candidate keeps the ITL budget, wait for one that does, but never past
  ``max_hold_s`` after the request's arrival, nor once what is left of its TTFT budget no longer covers
  its predicted prefill; 0 never holds.
- Pure: numbers in, numbers out; time is an argument.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StepModel:
    """One engine step's time from what it schedules; defaults: 7B bf16 on one H200, vLLM 0.26 eager."""

    overhead_ms: float = 12.869
    per_seq_ms: float = 0.0621
    host_ms_per_prefill_token: float = 0.002338
    prefill_ms_per_token: float = 0.012051
    prefill_ms_per_ktoken2: float = 0.8886
    prefill_attention_ms_per_mpair: float = 0.7353
    weights_ms: float = 3.2
    host_overlaps_device: bool = True

    def step_ms(self, prefill: int, seqs: int, pairs: float = 0.0) -> float:
        host = self.overhead_ms + self.per_seq_ms * seqs + self.host_ms_per_prefill_token * prefill
        compute = (
            self.prefill_ms_per_token * prefill
            + self.prefill_ms_per_ktoken2 * (prefill / 1000.0) ** 2
            + self.prefill_attention_ms_per_mpair * pairs / 1e6
        )
        device = max(self.weights_ms, compute)
        return max(host, device) if self.host_overlaps_device else host + device


@dataclass(frozen=True, slots=True)
class Stall:
    """What one candidate's prediction says."""

    steps_to_first_token: int
    own_steps: int
    over_budget_steps: int
    harmed_gaps: int
    extra_ms: float
    """Time each decoder beside the prompt loses to its prefill, over plain decode steps."""
    first_token_s: float
    """From now to the prompt's first token: the prefill queued ahead of it, then its own."""


@dataclass(frozen=True, slots=True)
class PrefillModel:
    chunk_tokens: int
    step: StepModel = StepModel()
    max_hold_s: float = 0.0

    def predict(self, uncached: int, cached: int, requests: float, budgeted: float, queued: int, itl_s: float) -> Stall:
        """The prompt's ``uncached`` tokens (after ``cached`` ones) on an engine with ``requests`` in
        flight (``budgeted`` of them with an ITL budget) and ``queued`` prefill tokens ahead of it."""
        step = self.step
        decoders = max(0, math.ceil(requests))
        room = max(1, self.chunk_tokens - decoders)
        ahead, uncached = max(0, queued), max(1, uncached)
        plain = step.step_ms(0, decoders)
        budget_ms = itl_s * 1000.0
        # Whole steps of the queue ahead first (someone else's stall), then each step that carries
        # some of this prompt, the first of them maybe sharing its budget with the queue's tail.
        full_ahead = ahead // room
        first_ms = full_ahead * step.step_ms(room, decoders + 1, room * room / 2.0)
        start, total = full_ahead * room, ahead + uncached
        own = over = 0
        extra = 0.0
        while start < total:
            end = min(total, start + room)
            mine = end - max(start, ahead)
            done = cached + max(start, ahead) - ahead
            ms = step.step_ms(end - start, decoders + 1, mine * (done + mine / 2.0))
            first_ms += ms
            own += 1
            extra += ms - plain
            over += ms > budget_ms
            start = end
        harmed = math.ceil(max(0.0, budgeted)) * over
        return Stall(full_ahead + own, own, over, harmed, round(extra, 3), first_ms / 1000.0)

    @staticmethod
    def rank(stall: Stall, ttft_left_s: float | None) -> tuple[int, int, float]:
        in_time = ttft_left_s is None or stall.first_token_s <= ttft_left_s
        keeps = stall.harmed_gaps == 0 and in_time
        return (0 if keeps else 1, stall.harmed_gaps, stall.first_token_s)

    def hold(self, best: Stall, age_s: float, ttft_left_s: float | None) -> bool:
        """Wait for a candidate that keeps the ITL budget (see the module's rules)."""
        if best.harmed_gaps == 0 or age_s >= self.max_hold_s:
            return False
        return ttft_left_s is None or best.first_token_s < ttft_left_s
