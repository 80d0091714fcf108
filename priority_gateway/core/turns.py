"""Agent sessions as admission sees them: a request naming a session is a turn of it.

Rules:
- A turn's arrival (the first ``submit``, not a retry) tells the book (``sessions``) whether it
  continues a paused session; the dispatcher then queues it in the continuing lane (``queue``).
- Its end (``finish``, whatever the answer) pauses the session on its engine holding its context
  (prompt and output); a refusal or a client leaving the queue ends the turn with no hold.
- What the book holds per engine is each ``EngineState.held_kv``, which routing weighs and the fleet
  tells the other replicas (every change is reported to it); holds expire on ``expire``.
- A continuing turn whose session's engine is healthy but full while others have room waits for it
  (``waits``) as long as it has waited less than its first token would take where it could start
  now, computing its whole context (ski rental: its first token comes at most twice as late as the
  better of the two choices made knowing the future, and a seat freed in time costs no re-prefill
  and evicts nobody), and less than half its time left to start.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from priority_gateway.core.decisions import Dispatch, Notice, Rejection
from priority_gateway.core.engines import EngineState
from priority_gateway.core.fleet import Fleet
from priority_gateway.core.pools import Pool
from priority_gateway.core.request import RouteRequest
from priority_gateway.core.sessions import SessionBook, SessionSettings


class SessionTurns:
    def __init__(self, settings: SessionSettings, fleet: Fleet) -> None:
        self.book = SessionBook(settings)
        self._fleet = fleet
        self._engines: Mapping[str, EngineState] = {}

    def reindex(self, engines: Mapping[str, EngineState]) -> None:
        """The engines changed: each one's ``held_kv`` from the book."""
        self._engines = engines
        for engine_id, engine in engines.items():
            engine.held_kv = self.book.held(engine_id)

    def arrived(self, req: RouteRequest, now: float) -> None:
        """``req`` was submitted for the first time (not a retry): ``req.continuing`` set when it is a
        turn that continues a paused session."""
        if req.session is not None and (began := self.book.begin(req.id, req.session, now)):
            req.continuing, changed = began
            self._held_changed(changed)

    def ended(self, dispatch: Dispatch, now: float, generated: int | None, prompt: int | None) -> None:
        """The turn ran and ended (``generated``, ``prompt``: the engine's counts, when known)."""
        req = dispatch.request
        if req.session is not None and self.book.turns:
            output = generated if generated is not None else (req.max_tokens or 0)
            context = (req.prompt_tokens if prompt is None else prompt) + output
            self._held_changed(self.book.end(req.id, dispatch.engine.id, context, now))

    def abandoned(self, request_id: str) -> None:
        """The request ended before it ran: its turn holds nothing."""
        self.book.abandon(request_id)

    def refused(self, notices: Iterable[Notice]) -> None:
        """The turns refused among ``notices`` end with no hold."""
        if self.book.turns:
            for notice in notices:
                if isinstance(notice, Rejection):
                    self.book.abandon(notice.request.id)

    def expire(self, now: float) -> None:
        self._held_changed(self.book.expire(now))

    def waits(
        self,
        req: RouteRequest,
        pool: Pool,
        candidates: list[EngineState],
        now: float,
        start_by: float,
        exclude: Sequence[str] = (),
    ) -> bool:
        """Whether ``req``, a continuing turn, waits for its session's engine (the rules; ``start_by``:
        its start deadline) rather than starting on one of ``candidates``."""
        if not req.continuing or req.session is None or not candidates or not self.book.settings.wait_for_engine:
            return False
        session = self.book.get(req.session)
        home = None if session is None else session.engine
        if home is None or home in exclude or any(e.id == home for e in candidates):
            return False
        if not any(e.id == home for e in pool.healthy(exclude, req.model)):
            return False
        elsewhere = pool.ttft_model.predict(min(e.queued_prefill for e in candidates) + req.prompt_tokens)
        if elsewhere is None:
            return False  # no first token seen yet: nothing to weigh waiting against
        waited = now - req.arrival
        return waited < self.book.settings.wait_factor * elsewhere and waited < (start_by - req.arrival) / 2

    def _held_changed(self, engines: set[str]) -> None:
        for engine_id in engines:
            engine = self._engines.get(engine_id)
            if engine is not None:
                engine.held_kv = self.book.held(engine_id)
                self._fleet.load_changed(engine_id)
