"""The one table of what every replica last published, this one's own batches included.

Rules:
- One row per publisher, keyed by its 16-byte id; this replica's own row is fed by its own batches
  as the channel delivers them back, in the same order every replica applies them (what makes the
  holdings agree: ``holdings``). Totals over the others (``peer_*``, tenants) leave the own row out.
- A row holds what its publisher said last, as absolute values: per engine its ``EngineReport``
  (evidence from its last full batch, kept until the next full one), per ``(pool, tenant)`` its
  ``TenantShare``, and the slots it holds on each engine as applied in channel order. A full batch
  replaces everything the row had; other batches change what they name.
- A row not heard from within ``silent_s`` counts for nothing (``silence``: its reports, tenants and
  holdings go, it leads nothing); within ``window_s`` it is still counted among the replicas the
  limit is split by while the channel is down (``seen``). Past ``window_s`` it is forgotten. When
  the channel is lost, every row falls silent at once (its time is kept, for ``seen``).
- At most ``max_peers`` rows: the one heard from least recently is forgotten first.
- ``leader(engine)``: the lowest id among the rows, this one's included, that learn the engine's
  limit (their last full batch carried evidence for it) and have learned one (published a limit);
  None when nobody has. Every replica reading the same rows names the same leader.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from priority_gateway.core.fleet.wire import EngineReport, Report, TenantKey, TenantShare
from priority_gateway.core.limiter import Evidence

NOBODY = EngineReport()


@dataclass(slots=True)
class Row:
    sequence: int
    heard_at: float
    engines: dict[str, EngineReport] = field(default_factory=dict)
    evidence: dict[str, Evidence] = field(default_factory=dict)
    tenants: dict[TenantKey, TenantShare] = field(default_factory=dict)
    held: dict[str, int] = field(default_factory=dict)
    """Slots the publisher holds per engine, as every replica computes them (``holdings``)."""
    silent: bool = False

    def report(self, engine: str) -> EngineReport:
        return self.engines.get(engine, NOBODY)


@dataclass(slots=True)
class Applied:
    """What applying one batch changed."""

    engines: set[str] = field(default_factory=set)
    """Engines whose reports changed (load, limit, claims)."""
    tenants: bool = False


class FleetTable:
    def __init__(self, own: bytes, max_peers: int = 1024) -> None:
        self.own = own
        self.max_peers = max_peers
        self.rows: OrderedDict[bytes, Row] = OrderedDict()
        self._inflight: dict[str, int] = {}
        self._prefill: dict[str, int] = {}
        self._kv_held: dict[str, int] = {}
        # pool -> tenant -> [in flight, queued, weight] over the other rows (the weight: the latest heard)
        self._tenants: dict[str, dict[str, list[float]]] = {}

    # -- feeding it --------------------------------------------------------------------------

    def heard(self, publisher: bytes, sequence: int, now: float) -> tuple[Row, int]:
        """Note a batch; its row and how many of this publisher's batches were missed before it."""
        row = self.rows.get(publisher)
        if row is None:
            row = self.rows[publisher] = Row(sequence, now)
            missed = 0  # the first batch heard from it: nothing is known missing
        else:
            missed = max(0, sequence - row.sequence - 1) if not row.silent else 0
            row.sequence = max(sequence, row.sequence)
            row.heard_at = now
            row.silent = False
        self.rows.move_to_end(publisher)
        while len(self.rows) > self.max_peers:
            gone, old = self.rows.popitem(last=False)
            self._drop(gone, old)
        return row, missed

    def apply(self, publisher: bytes, report: Report) -> Applied:
        """A batch's reports (after ``heard``)."""
        row = self.rows[publisher]
        out = Applied()
        peer = publisher != self.own
        names = set(report.engines) | (set(row.engines) if report.full else set())
        for engine in names:
            told = report.engines.get(engine, NOBODY)
            if report.full:
                if told.evidence is not None:
                    row.evidence[engine] = told.evidence
                else:
                    row.evidence.pop(engine, None)
            new, old = _without_evidence(told), row.report(engine)
            if new == old:
                continue
            out.engines.add(engine)
            if peer:
                self._add(engine, old, -1)
                self._add(engine, new, 1)
            if new:
                row.engines[engine] = new
            else:
                row.engines.pop(engine, None)
        if report.full:
            for engine in set(row.evidence) - set(report.engines):
                del row.evidence[engine]
        out.tenants = self._apply_tenants(row, report, peer)
        return out

    def _apply_tenants(self, row: Row, report: Report, peer: bool) -> bool:
        told = report.tenants
        if not told and not report.full:
            return False
        changed = False
        if report.full:
            for key in set(row.tenants) - set(told):
                changed = True
                old = row.tenants.pop(key)
                if peer:
                    self._add_tenant(key, old, -1)
        for key, new in told.items():
            old_share = row.tenants.pop(key, None)
            if old_share is not None and peer:
                self._add_tenant(key, old_share, -1)
            if new:
                row.tenants[key] = new
                if peer:
                    self._add_tenant(key, new, 1)
            changed = changed or old_share != new
        return changed

    def silence(self, now: float, silent_s: float, window_s: float) -> set[str]:
        """Rows not heard within ``silent_s`` count for nothing, past ``window_s`` they are forgotten;
        the engines whose totals or holdings changed."""
        changed: set[str] = set()
        for publisher in list(self.rows):
            row = self.rows[publisher]
            quiet = now - row.heard_at
            if quiet > window_s:
                changed |= self._drop(publisher, self.rows.pop(publisher))
            elif quiet > silent_s and not row.silent:
                changed |= self._mute(publisher, row)
        return changed

    def silence_all(self) -> set[str]:
        """The channel was lost: nobody is heard any more (the rows' times stay, for ``seen``)."""
        changed: set[str] = set()
        for publisher, row in self.rows.items():
            changed |= self._mute(publisher, row)
        return changed

    def _mute(self, publisher: bytes, row: Row) -> set[str]:
        changed = self._drop(publisher, row)
        row.silent = True
        return changed

    def _drop(self, publisher: bytes, row: Row) -> set[str]:
        changed = set(row.engines) | set(row.held)
        if publisher != self.own:
            for engine, report in row.engines.items():
                self._add(engine, report, -1)
            for key, share in row.tenants.items():
                self._add_tenant(key, share, -1)
        row.engines.clear()
        row.evidence.clear()
        row.tenants.clear()
        row.held.clear()
        return changed

    # -- reading it --------------------------------------------------------------------------

    def peers(self) -> int:
        """Other replicas heard within ``silent_s``."""
        return sum(1 for p, row in self.rows.items() if p != self.own and not row.silent)

    def seen(self, now: float, window_s: float) -> int:
        """Replicas heard within ``window_s`` before ``now``, this one included."""
        return 1 + sum(1 for p, row in self.rows.items() if p != self.own and now - row.heard_at <= window_s)

    def active(self) -> list[tuple[bytes, Row]]:
        return [(p, row) for p, row in self.rows.items() if not row.silent]

    def peer_inflight(self, engine: str) -> int:
        return self._inflight.get(engine, 0)

    def peer_prefill(self, engine: str) -> int:
        return self._prefill.get(engine, 0)

    def peer_kv_held(self, engine: str) -> int:
        """Tokens the others' paused sessions hold on ``engine``, as they last said."""
        return self._kv_held.get(engine, 0)

    def leader(self, engine: str) -> bytes | None:
        return min(
            (
                p
                for p, row in self.rows.items()
                if not row.silent and engine in row.evidence and row.report(engine).limit > 0
            ),
            default=None,
        )

    def limit_of(self, publisher: bytes, engine: str) -> float:
        row = self.rows.get(publisher)
        return row.report(engine).limit if row is not None else 0.0

    def peer_evidence(self, engine: str) -> list[Evidence]:
        """What the others' last full batches said their gaps on ``engine`` showed."""
        return [e for p, row in self.rows.items() if p != self.own and (e := row.evidence.get(engine)) is not None]

    def peer_adapters(self, engine: str) -> set[str]:
        """The LoRA adapters the others' requests in flight on ``engine`` run on."""
        return {a for p, row in self.rows.items() if p != self.own for a in row.report(engine).adapters}

    def tenants_of(self, pool: str) -> dict[str, tuple[int, int, float]]:
        """The others' tenants active in ``pool``: requests running there, queued, weight."""
        return {tenant: (int(c[0]), int(c[1]), c[2]) for tenant, c in self._tenants.get(pool, {}).items()}

    def tenant_running(self, tenant: str) -> int:
        """The others' requests of ``tenant`` in flight, in every pool."""
        return sum(int(tenants[tenant][0]) for tenants in self._tenants.values() if tenant in tenants)

    @property
    def has_tenants(self) -> bool:
        return bool(self._tenants)

    # -- totals ------------------------------------------------------------------------------

    def _add(self, engine: str, report: EngineReport, sign: int) -> None:
        pairs = ((self._inflight, report.inflight), (self._prefill, report.prefill), (self._kv_held, report.kv_held))
        for totals, value in pairs:
            if value:
                total = totals.get(engine, 0) + sign * value
                if total:
                    totals[engine] = total
                else:
                    totals.pop(engine, None)

    def _add_tenant(self, key: TenantKey, share: TenantShare, sign: int) -> None:
        pool, tenant = key
        tenants = self._tenants.setdefault(pool, {})
        counts = tenants.setdefault(tenant, [0.0, 0.0, share.weight])
        counts[0] += sign * share.inflight
        counts[1] += sign * share.queued
        if sign > 0:
            counts[2] = share.weight
        if counts[0] <= 0 and counts[1] <= 0:
            del tenants[tenant]
            if not tenants:
                del self._tenants[pool]


def _without_evidence(report: EngineReport) -> EngineReport:
    if report.evidence is None:
        return report
    return EngineReport(
        report.inflight,
        report.prefill,
        report.limit,
        report.claim,
        report.spare,
        report.held,
        report.kv_held,
        None,
        report.adapters,
    )
