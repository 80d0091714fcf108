"""The one table of what every replica last published: absolute values, bounded, silent rows count for
nothing, and one leader per engine that every replica names alike."""

from priority_gateway.core.fleet.table import FleetTable
from priority_gateway.core.fleet.wire import EngineReport, Report, TenantShare
from priority_gateway.core.limiter import Evidence

OWN = b"z" * 16


def publisher(n: int) -> bytes:
    return n.to_bytes(16, "big")


def tell(table: FleetTable, who: bytes, report: Report, now: float = 0.0, sequence: int = 1) -> int:
    _, missed = table.heard(who, sequence, now)
    table.apply(who, report)
    return missed


def test_the_others_totals_leave_this_replicas_own_row_out():
    table = FleetTable(OWN)
    tell(table, publisher(1), Report(engines={"e": EngineReport(2, 100)}))
    tell(table, OWN, Report(engines={"e": EngineReport(5, 500)}))
    assert table.peer_inflight("e") == 2 and table.peer_prefill("e") == 100
    assert table.peers() == 1


def test_reports_are_absolute_and_a_full_batch_is_everything():
    table = FleetTable(OWN)
    tell(table, publisher(1), Report(engines={"a": EngineReport(3), "b": EngineReport(1)}))
    tell(table, publisher(1), Report(engines={"a": EngineReport(3)}), sequence=2)  # repeated: nothing changes
    assert (table.peer_inflight("a"), table.peer_inflight("b")) == (3, 1)
    missed = tell(table, publisher(1), Report(engines={"b": EngineReport(2)}, full=True), sequence=5)
    assert missed == 2
    assert (table.peer_inflight("a"), table.peer_inflight("b")) == (0, 2), "a full batch leaves out what is gone"


def test_tenant_counts_are_absolute_and_silence_forgets_them():
    table = FleetTable(OWN)
    tell(table, publisher(1), Report(tenants={("p", "a"): TenantShare(3, 1, 2.0)}))
    tell(table, publisher(2), Report(tenants={("p", "a"): TenantShare(1), ("p", "b"): TenantShare(2)}))
    assert table.tenants_of("p") == {"a": (4, 1, 1.0), "b": (2, 0, 1.0)}
    tell(table, publisher(1), Report(tenants={("p", "a"): TenantShare(3, 1, 2.0)}), 1.0, 2)
    assert table.tenants_of("p")["a"][0] == 4
    tell(table, publisher(2), Report(tenants={("p", "b"): TenantShare(0, 1)}, full=True), 2.0, 2)
    assert table.tenants_of("p") == {"a": (3, 1, 2.0), "b": (0, 1, 1.0)}
    assert table.tenant_running("a") == 3
    table.silence(4.5, silent_s=3.0, window_s=30.0)
    assert table.tenants_of("p") == {"b": (0, 1, 1.0)} and table.peers() == 1


def test_silent_rows_count_for_nothing_but_are_remembered_for_the_safe_share_then_forgotten():
    table = FleetTable(OWN)
    tell(table, publisher(1), Report(engines={"e": EngineReport(2)}))
    assert table.silence(5.0, silent_s=3.0, window_s=30.0) == {"e"}
    assert table.peer_inflight("e") == 0 and table.peers() == 0
    assert table.seen(5.0, 30.0) == 2, "heard within the window: it still splits the limit"
    table.silence(40.0, silent_s=3.0, window_s=30.0)
    assert table.seen(40.0, 30.0) == 1 and not table.rows
    tell(table, publisher(1), Report(engines={"e": EngineReport(1)}), 41.0, 9)
    assert table.peer_inflight("e") == 1, "heard again: it counts again, with nothing known missed"


def test_losing_the_channel_silences_everyone_at_once():
    table = FleetTable(OWN)
    for n in range(3):
        tell(table, publisher(n), Report(engines={"e": EngineReport(1)}, tenants={("p", "t"): TenantShare(1)}))
    assert table.silence_all() == {"e"}
    assert table.peer_inflight("e") == 0 and table.tenants_of("p") == {} and table.seen(0.0, 30.0) == 4


def test_rows_are_bounded_and_the_least_recent_is_forgotten_first():
    table = FleetTable(OWN, max_peers=3)
    for n in range(5):
        tell(table, publisher(n), Report(engines={"e": EngineReport(1, 10)}, full=True), float(n))
    assert table.peers() == 3
    assert table.peer_inflight("e") == 3 and table.peer_prefill("e") == 30
    assert set(table.rows) == {publisher(2), publisher(3), publisher(4)}


def test_the_leader_is_the_lowest_id_that_learns_the_limit_and_has_learned_one():
    table = FleetTable(OWN)
    learns = Evidence()
    tell(table, publisher(5), Report(engines={"e": EngineReport(limit=4.0, evidence=learns)}, full=True))
    tell(table, publisher(2), Report(engines={"e": EngineReport(limit=0.0, evidence=learns)}, full=True))
    tell(table, publisher(1), Report(engines={"e": EngineReport(limit=3.0)}, full=True))
    assert table.leader("e") == publisher(5), "2 has learned nothing yet, 1 has no budget for it"
    tell(table, publisher(2), Report(engines={"e": EngineReport(limit=4.0)}), sequence=2)
    assert table.leader("e") == publisher(2), "evidence is kept until the next full batch"
    tell(table, publisher(2), Report(engines={"e": EngineReport(limit=4.0)}, full=True), sequence=3)
    assert table.leader("e") == publisher(5), "a full batch without evidence: it no longer learns"
    table.silence_all()
    assert table.leader("e") is None


def test_the_adapters_the_others_run_on_an_engine_are_theirs_until_they_say_otherwise():
    table = FleetTable(OWN)
    tell(table, publisher(1), Report(engines={"e": EngineReport(1, adapters=("a",))}))
    tell(table, OWN, Report(engines={"e": EngineReport(1, adapters=("b",))}))
    assert table.peer_adapters("e") == {"a"}, "this replica's own are its own to know"
    tell(table, publisher(1), Report(engines={"e": EngineReport()}), sequence=2)
    assert table.peer_adapters("e") == set()
