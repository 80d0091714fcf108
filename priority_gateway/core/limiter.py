"""Adaptive concurrency limit of one engine: AIMD steered by ITL measured per load level.

Why AIMD, and why per level: under continuous batching ITL does not grow like a queue
(smoothly with load) but in steps, when more sequences share each decode step and when new
prompts' prefills interrupt decoding; its p99 crosses the budget at a cliff (the article's
NVFP4 engine holds the SLO at 4 and misses at 8). A gradient method fitted to a smooth
curve overshoots such a cliff. AIMD probes one slot at a time and backs off hard, and by
remembering which load levels it found over budget it knows where the cliff is, instead of
rediscovering it by crossing it over and over.

Why not shrink on every p99 over budget: a p99 is one gap in a hundred, and every new prompt's
prefill stalls the requests decoding beside it for one slow step. A window of a few hundred gaps
holds a few such stalls at any load, so its p99 over budget is often a handful of unlucky gaps
(the share of gaps over budget is not really above 1 %); shrinking on it refuses work the engine
serves within budget. And a gap the relay measured late is not always one the engine made late:
when the gateway's host is starved (a client hammering it with requests it refuses), every relayed
gap grows, and fewer requests on the engine would neither explain nor fix that.

Rules:
- Each ITL gap the relay measures goes to the engine's window and to the windows of the load level
  (requests in flight, rounded) at which it was seen: a fresh one of ``window_s`` and a long one
  of ``level_window_s``. Only fresh evidence counts against a level; older bad evidence is only
  remembered as the level's verdict, for ``level_window_s``.
- A level is over budget when the share of its fresh gaps above ``high * budget`` is above 1 %
  with confidence (a one-sided Wilson bound, counting engine steps: a stall slows all ``level``
  requests of a step at once, so ``level`` slow gaps are one piece of evidence, not ``level``);
  within budget when their p99 is at most ``high * budget``. Growing fast asks more: the p99 of the
  level's long window within ``low * budget`` (a steady estimate: a step up is a step towards the
  cliff). The engine's whole window is far over budget when its share (of steps, counted at the
  limit) above 1.5 budgets is above 1 % with confidence.
- The engine's own ITL histogram (vLLM's ``vllm:inter_token_latency_seconds``, scraped), when it
  has one, must not contradict the relay before the limit shrinks: it contradicts when its share
  of gaps above the budget is under half the relay's over the same window.
- Every ``interval_s`` the limit is reconsidered:
  - shrink when the level at the limit is over budget, or, when the load fell short of the limit,
    the highest level it reached within ``window_s`` (a limit grown fast may never be reached,
    and over-budget gaps where the load does run must bring it down), or the whole engine is far
    over it, and the engine does not contradict it: to the highest level below that one found within
    budget lately, else multiplicatively (to 70 %); then no further shrink for ``cooldown_s``, and
    the whole window starts afresh (what it saw above the new limit says nothing about it);
  - grow when the limit was reached since the last decision (by this replica's load and, where the
    engine is scraped, by what it carries: what it runs, and what it holds waiting for a step's prefill
    budget, not what waits beside an unchanged number running, scrape after scrape, for a seat) and the
    next level was not found over budget lately (the known cliff): by ``growth`` of the limit (at least
    one) while its level's long p99 is within ``low * budget``, by one while its fresh p99 is within
    ``high * budget``; never past a level found over budget once, however long ago (probing a cliff
    again goes one step at a time).
    An engine whose ITL is set by what its steps prefill, not by how many decode, shows the same p99
    at 4 requests as at 32: growing one at a time from the probe level took it minutes to reach the
    concurrency its TTFT budget needed, while the queue refused half the traffic. Only far from the
    budget (``low``: a fifth below it) is a jump safe: where the p99 sits near the budget a cliff of
    prefill stalls is close (decode gaps of 35-43 ms under a 50 ms budget), and a jump of half the limit
    crossed it before the evidence came in (at 0.9, ``benchmarks/admission.py``'s Azure sweep ran ITL
    p99 83.6 ms at 2x; at 0.8, 48.2 ms, with the GPU scenes' growth unchanged);
  - full (only where the pool does not declare the engines' seats): an engine whose scrapes show it
    holding requests waiting (vLLM's ``num_requests_waiting``) beside the same number running,
    ``queue_scrapes`` in a row, runs all it will: a limit above what it runs only moves the wait into
    the engine, where nobody orders, sheds or counts it against the TTFT budget, while the gaps of
    those running stay within budget. The limit comes down to what it runs, the level above that is
    found over budget, and nothing grows while it stays full (a request waiting for a step's prefill
    budget, beside a number running that changes, is not this). A chunked-prefill engine short of its
    prefill budget can show the same number running twice by chance: on an H100 running 256 seats the
    rule once took 34 for its seats and held the limit there for a minute while the queue refused a
    fifth of the traffic, so declared seats (``seats``) turn it off;
  - recover: below ``initial`` (the probe level), one step up once ``recover_s`` passed without a
    shrink or a step and without the next level found over budget: a limit learned under an
    overload climbs back when the engine idles or evidence is missing (no evidence is not bad
    evidence), and is measured afresh there;
  - otherwise hold. A limit that was not reached proves nothing and does not grow past ``initial``.
- An engine without a budget keeps a fixed limit.
- Every verdict above is told from counts (gaps, and those within or surely above a bound: a p99
  within a bound is at least ``ceil(0.99 * gaps)`` of them within it), so the windows of several
  replicas add up: ``evidence`` is this replica's own, as counts; ``update`` judges on its own plus
  those ``heard`` from the other replicas (``core/fleet``), as one replica seeing every gap would.
- Several replicas learn one limit: only the one that ``lead``s (the dispatcher picks it) moves the
  limit; the others ``follow`` the limit it publishes, restart their whole window when it shrinks
  (as the leader's did), and still judge the levels on the same counts, so that one taking over
  knows where the cliffs are.
- Until it has learned or taken a limit (``learned``), a replica's limit is not the fleet's to lead.
- ``reason`` says why the limit last changed (or held against a relay the engine contradicted).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from priority_gateway.core.window import LatencyWindow, within

_ALLOWED = 0.01  # a p99 budget lets 1 % of gaps through
_Q = 1 - _ALLOWED
_Z = 1.64  # one-sided 95 %
_FAR = 1.5  # budgets: the whole window's net


@dataclass(slots=True)
class LimitSettings:
    initial: float = 2.0
    minimum: float = 1.0
    maximum: float = 256.0
    interval_s: float = 2.0
    cooldown_s: float = 10.0
    low: float = 0.8
    """A level whose long p99 is within this share of the budget is far from it: the limit may grow by ``growth``."""
    high: float = 1.0
    min_samples: int = 100
    window_s: float = 20.0
    level_window_s: float = 120.0
    recover_s: float = 30.0
    unbudgeted: float = 64.0
    growth: float = 0.5
    """A step up adds this share of the limit (at least one request), never past a level known over budget."""
    queue_scrapes: int = 2
    """Scrapes in a row that must show the engine holding requests waiting while it runs the same number,
    before that number counts as all it runs."""
    seats: float | None = None
    """The engine's ``--max-num-seqs`` as its pool declares it: declared, the limit never passes it and no
    number of requests running is taken for the engine's seats (what it holds waiting below them waits for
    a step's prefill budget); None: learned from the engine's queue, as ``full`` above says."""


@dataclass(frozen=True, slots=True)
class LevelCounts:
    """What the gaps seen at one load level showed, as counts that replicas can add up."""

    fresh: int = 0
    """Gaps in the level's fresh window (``window_s``)."""
    fresh_over: int = 0
    """Of them, surely above ``high * budget``."""
    fresh_within: int = 0
    """Of them, within ``high * budget``."""
    long: int = 0
    """Gaps in the level's long window (``level_window_s``)."""
    long_within: int = 0
    """Of them, within ``low * budget``."""

    def __add__(self, other: LevelCounts) -> LevelCounts:
        return LevelCounts(
            self.fresh + other.fresh,
            self.fresh_over + other.fresh_over,
            self.fresh_within + other.fresh_within,
            self.long + other.long,
            self.long_within + other.long_within,
        )


@dataclass(frozen=True, slots=True)
class Evidence:
    """One replica's gaps on one engine as counts: its whole fresh window and each level's windows."""

    gaps: int = 0
    """Gaps in the whole fresh window."""
    over: int = 0
    """Of them, surely above ``high * budget``."""
    far: int = 0
    """Of them, surely above 1.5 budgets."""
    levels: dict[int, LevelCounts] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.gaps or self.levels)


def pooled(parts: Iterable[Evidence]) -> Evidence:
    """Several replicas' evidence on one engine, added up."""
    gaps = over = far = 0
    levels: dict[int, LevelCounts] = {}
    for part in parts:
        gaps, over, far = gaps + part.gaps, over + part.over, far + part.far
        for level, counts in part.levels.items():
            known = levels.get(level)
            levels[level] = counts if known is None else known + counts
    return Evidence(gaps, over, far, levels)


def clearly_over(above: float, total: float, share: float = _ALLOWED) -> bool:
    """``above`` of ``total`` is more than ``share`` with confidence (Wilson lower bound)."""
    if total <= 0 or above <= share * total:
        return False
    p = above / total
    z2 = _Z * _Z
    centre = p + z2 / (2 * total)
    spread = _Z * math.sqrt(p * (1 - p) / total + z2 / (4 * total * total))
    return (centre - spread) / (1 + z2 / total) > share


class ConcurrencyLimit:
    __slots__ = (
        "_carried",
        "_cliff",
        "_engine",
        "_engine_last",
        "_last_decrease",
        "_last_step",
        "_next_update",
        "_peak",
        "_peaks",
        "_queue_seen_at",
        "_queueing",
        "_safe",
        "_seats",
        "budget_s",
        "history",
        "itl",
        "levels",
        "limit",
        "reason",
        "settings",
    )

    def __init__(self, budget_s: float | None, settings: LimitSettings, now: float = 0.0) -> None:
        self.settings = settings
        self.budget_s = budget_s
        self.limit = settings.initial if budget_s is not None else settings.unbudgeted
        self.itl = LatencyWindow(settings.window_s)
        self.levels: dict[int, LatencyWindow] = {}
        self.history: dict[int, LatencyWindow] = {}
        self.reason = "initial"
        self._cliff: dict[int, float] = {}  # level -> when it was last found over budget
        self._safe: dict[int, float] = {}  # level -> when it was last found within budget
        self._engine: deque[tuple[float, float, float]] = deque()  # (when, gaps, gaps over budget)
        self._engine_last: tuple[float, float] | None = None
        self._peak = 0.0
        self._peaks: deque[tuple[float, float]] = deque()  # (when, the highest load since the decision before)
        self._next_update = now + settings.interval_s
        self._last_decrease = -math.inf
        self._last_step = now
        self._queueing = 0  # scrapes in a row that showed the engine holding requests waiting
        self._queue_seen_at = -math.inf
        self._seats = 0.0  # what it ran meanwhile
        self._carried = -1.0  # the most the engine's scrapes showed it carrying since the last step (-1: none)

    @property
    def learned(self) -> bool:
        """The limit was learned (here, or by the replica it follows): not the probe level nothing moved yet."""
        return self.budget_s is not None and self.reason != "initial"

    def follow(self, learned: float, now: float) -> bool:
        """Take the limit the replica that leads learned (this one does not move it); True when it changed."""
        if self.budget_s is None:
            return False
        new = max(self.settings.minimum, min(self.settings.maximum, learned))
        old, self.limit, self.reason = self.limit, new, "learned_by_peers"
        if new < old:
            self._last_decrease = now
            self.itl.reset()  # as the leader's: what was seen above the new limit says nothing about it
        if new != old:
            self._last_step = now
        return new != old

    def evidence(self, now: float) -> Evidence:
        """This replica's own gaps as counts (``Evidence``), for the other replicas."""
        budget = self.budget_s
        if budget is None:
            return Evidence()
        s = self.settings
        high, low = s.high * budget, s.low * budget
        levels = {}
        for level, window in self.levels.items():
            history = self.history[level]
            history.expire(now)
            window.expire(now)
            if not history.count and not window.count:
                continue
            levels[level] = LevelCounts(
                window.count,
                window.count_above(high, now),
                window.count_at_most(high, now),
                history.count,
                history.count_at_most(low, now),
            )
        itl = self.itl
        itl.expire(now)
        return Evidence(itl.count, itl.count_above(high, now), itl.count_above(_FAR * budget, now), levels)

    def observe_itl(self, seconds: float, load: float, now: float, times: int = 1) -> None:
        self.itl.observe(seconds, now, times)
        level = max(1, round(load))
        window = self.levels.get(level)
        if window is None:
            window = self.levels[level] = LatencyWindow(self.settings.window_s)
            self.history[level] = LatencyWindow(self.settings.level_window_s)
        window.observe(seconds, now, times)
        self.history[level].observe(seconds, now, times)

    def observe_engine_itl(self, buckets: Sequence[tuple[float, float]], now: float) -> None:
        """The engine's cumulative ITL histogram, ``(upper bound, count)`` pairs, from a scrape."""
        budget = self.budget_s
        if budget is None or not buckets:
            return
        edges = [count for bound, count in buckets if bound <= self.settings.high * budget]
        if not edges:
            return  # no bucket edge at or below the budget: the histogram cannot judge it
        total = max(count for _, count in buckets)
        within = edges[-1]
        last, self._engine_last = self._engine_last, (total, within)
        if last is None:
            return
        gaps, fast = total - last[0], within - last[1]
        if gaps < 0 or fast < 0:
            gaps, fast = total, within  # the engine restarted: its counters began again
        if gaps > 0:
            self._engine.append((now, gaps, gaps - fast))
        horizon = now - self.settings.window_s
        while self._engine and self._engine[0][0] < horizon:
            self._engine.popleft()

    def note_engine_queue(self, running: float, waiting: float, scraped_at: float | None) -> None:
        """What the engine's latest scrape said it runs and holds waiting (vLLM's ``num_requests_running``
        and ``num_requests_waiting``); a scrape already seen counts once."""
        if scraped_at is None or scraped_at <= self._queue_seen_at:
            return
        self._queue_seen_at = scraped_at
        if waiting < 1 or running < 1 or self.settings.seats is not None:
            # Declared seats are known: a queue is never read as them (everything waiting is carried).
            self._queueing = 0
        elif self._queueing and running == self._seats:
            self._queueing += 1
        else:
            # Running a different number than at the last queueing scrape: it is not at its seats yet
            # (a request waits for a step's prefill budget), or they changed; counted afresh.
            self._queueing, self._seats = 1, running
        # What it carries: a request waiting for a step's prefill budget is carried (the next steps take
        # it); one waiting beside the same number running, scrape after scrape, waits for a seat.
        seat_bound = self._queueing > 1
        self._carried = max(self._carried, running if seat_bound else running + waiting)

    def note_load(self, load: float) -> None:
        if load > self._peak:
            self._peak = load

    def update(self, now: float, load: float, heard: Sequence[Evidence] = (), lead: bool = True) -> bool:
        """Reconsider the limit if an interval has passed, on this replica's gaps and those ``heard`` from
        the others; only while it ``lead``s does the limit move. True when it changed."""
        if now < self._next_update:
            return False
        s = self.settings
        self._next_update = now + s.interval_s
        peak, self._peak = max(self._peak, load), load
        budget = self.budget_s
        if budget is None:
            return False
        evidence = self.evidence(now)
        if heard:
            evidence = pooled((evidence, *heard))
        old = self.limit
        current = max(1, math.floor(self.limit))
        # The limit's level, or the highest the load reached within the fresh window when it fell short of
        # the limit: a limit grown fast may never be reached, and over-budget gaps where the load does run
        # must bring it down (the window's highest, not the last interval's: a queue draining is no level).
        peaks = self._peaks
        peaks.append((now, peak))
        while peaks[0][0] < now - s.window_s:
            peaks.popleft()
        top = min(current, max(1, math.floor(max(p for _, p in peaks) + 0.5)))
        judged = self._judge_levels(evidence, now)
        worst = next((level for level in (current, top) if level in judged), None)
        if worst is None and self._far_over(evidence, current):
            worst = current
        over = worst is not None
        if not lead:
            return False
        engine = self._engine_verdict(evidence, now) if over else None
        full = self._queueing >= s.queue_scrapes
        if engine is not None:
            self.reason = engine  # the engine's own figures are awaited, or say it is on time
        elif worst is not None:
            if now - self._last_decrease >= s.cooldown_s:
                self.limit = self._safe_level(worst, now)
                self._last_decrease = self._last_step = now
                self.reason = "itl_over_budget"
                self.itl.reset()  # gaps seen above the new limit say nothing about it
        elif full and self.limit >= self._seats + 1:
            # The engine runs no more than it does and queues the rest: those wait where nobody orders,
            # sheds or counts them against the TTFT budget. Its seats are the limit, and the level above
            # them is known over budget (it is probed again as any such level is).
            seats = max(1, math.floor(self._seats))
            self.limit = max(s.minimum, float(seats))
            self._cliff[seats + 1] = now
            self._last_step = now
            self.reason = "engine_queueing"
        elif (
            not full
            and self._reached(peak, current)
            and (up := self._step_up(current, self._headroom(evidence, current), now))
        ):
            self.limit = min(s.maximum, float(up))
            self._last_step = now
            self.reason = "itl_within_budget"
        elif (
            not full
            and self.limit < s.initial
            and now - self._last_step >= s.recover_s
            and now - self._cliff.get(current + 1, -math.inf) >= s.recover_s
        ):
            self.limit = min(s.initial, float(current + 1))
            self._last_step = now
            self.reason = "recovering"
        if self.limit != old:
            self._carried = min(self._carried, 0.0)  # what the engine carries at the new limit is yet to be seen
        return self.limit != old

    def _reached(self, peak: float, current: int) -> bool:
        """The limit was reached since the last decision: by this replica's load and, where the engine is
        scraped, by what it carries (requests it holds waiting for a seat do not count; one waiting for a
        step's prefill budget does)."""
        return peak >= self.limit - 0.5 and (self._carried < 0 or self._carried >= current)

    def _judge_levels(self, evidence: Evidence, now: float) -> set[int]:
        """Remember each level's verdict; the levels over budget now."""
        s = self.settings
        over = set()
        for level, counts in evidence.levels.items():
            if counts.fresh < s.min_samples:
                continue
            # One prefill stalls every request decoding beside it: the gaps of a level come in steps
            # of ``level``, slow or fast together, so the evidence is the steps, not the gaps.
            if clearly_over(counts.fresh_over / level, counts.fresh / level):
                self._cliff[level] = now
                over.add(level)
            elif within(_Q, counts.fresh, counts.fresh_within):
                self._safe[level] = now
        return over

    def _within(self, evidence: Evidence, level: int) -> bool:
        """The level's long p99 is within ``low * budget``, on at least ``min_samples`` gaps."""
        counts = evidence.levels.get(level)
        return (
            counts is not None
            and counts.long >= self.settings.min_samples
            and within(_Q, counts.long, counts.long_within)
        )

    def _headroom(self, evidence: Evidence, level: int) -> float:
        """How far the limit may grow from ``level``: by ``growth`` of it while the level's long p99 is within
        ``low * budget`` (far from any cliff), by one while its fresh p99 is still within ``high * budget``
        (near the budget: a step at a time), else not at all; each on at least ``min_samples`` gaps."""
        counts = evidence.levels.get(level)
        if counts is None:
            return 0.0
        s = self.settings
        if self._within(evidence, level):
            return s.growth
        if counts.fresh >= s.min_samples and within(_Q, counts.fresh, counts.fresh_within):
            return 1e-9
        return 0.0

    def _step_up(self, current: int, growth: float, now: float) -> int | None:
        """The level to grow to: ``growth`` of the limit further (at least one), short of any level found
        over budget within ``level_window_s``; None when the next level is such a level, or without
        headroom (``growth`` 0)."""
        if not growth:
            return None
        s = self.settings
        target = max(current + 1, math.floor(current * (1 + growth)))
        # Up to a level found over budget once, however long ago, one step at a time: probing a cliff
        # again costs a stall of everyone on it, and a jump past it more.
        above = [level for level in self._cliff if level > current]
        if above:
            target = max(current + 1, min(target, min(above)))
        for level in range(current + 1, target + 1):
            if now - self._cliff.get(level, -math.inf) <= s.level_window_s:
                return level - 1 if level > current + 1 else None
        return target

    def _far_over(self, evidence: Evidence, level: int) -> bool:
        # The whole window mixes levels; it acts once well filled, as a net under the level windows.
        if evidence.gaps < 5 * self.settings.min_samples:
            return False
        return clearly_over(evidence.far / level, evidence.gaps / level)

    def _engine_verdict(self, evidence: Evidence, now: float) -> str | None:
        """Why the relay's slowness does not count against the engine, or None when it does."""
        if self._engine_last is None:
            return None  # the engine keeps no ITL histogram: the relay's evidence stands
        horizon = now - self.settings.window_s
        gaps = sum(n for when, n, _ in self._engine if when >= horizon)
        if gaps < self.settings.min_samples:
            return "awaiting_engine_itl"
        slow = sum(k for when, _, k in self._engine if when >= horizon)
        relay_share = evidence.over / max(1, evidence.gaps)
        return "relay_slow_engine_on_time" if slow / gaps < 0.5 * relay_share else None

    def _safe_level(self, current: int, now: float) -> float:
        s = self.settings
        for level in range(current - 1, 0, -1):
            safe = self._safe.get(level, -math.inf)
            if now - safe <= s.level_window_s and safe > self._cliff.get(level, -math.inf):
                return max(s.minimum, float(level))
        return max(s.minimum, float(math.floor(current * 0.7)))
