import math

from hypothesis import given, settings
from hypothesis import strategies as st

from priority_gateway.core.fair_queue import CONTINUING, NEW, FairQueue
from tests.support.examples import examples

WEIGHTS = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 1.0}

# A scenario: pushes (tenant, cost) interleaved with starts of whatever the queue puts first.
push = st.tuples(st.sampled_from(sorted(WEIGHTS)), st.integers(min_value=1, max_value=400))
step = st.one_of(push, st.just("start"))


def run(steps):
    """Play ``steps``; per start: (tenant started, cost, tenants backlogged just before)."""
    queue: FairQueue[str] = FairQueue()
    served = []
    costs: dict[str, int] = {}
    for n, op in enumerate(steps):
        if op == "start":
            backlogged = frozenset(queue.tenants())
            entry = queue.peek()
            if entry is None:
                continue
            assert queue.take(entry.key) is entry
            served.append((entry.tenant, entry.cost, backlogged))
        else:
            tenant, cost = op
            queue.push(f"r{n}", tenant, cost, math.inf, float(n), f"r{n}", WEIGHTS[tenant])
            costs[tenant] = max(costs.get(tenant, 0), cost)
    return served, costs


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(step, min_size=1, max_size=120))
def test_shares_follow_weights_within_the_sfq_bound_while_both_are_backlogged(steps):
    served, most = run(steps)
    # Over every run of consecutive starts in which tenants i and j both stay backlogged, the work each
    # got per weight differs by at most one largest request of each per weight (Goyal et al., SFQ).
    for first in range(len(served)):
        work: dict[str, float] = {}
        for last in range(first, len(served)):
            tenant, cost, _ = served[last]
            work[tenant] = work.get(tenant, 0.0) + cost
            both = frozenset.intersection(*(b for _, _, b in served[first : last + 1]))
            for i in both:
                for j in both:
                    gap = work.get(i, 0.0) / WEIGHTS[i] - work.get(j, 0.0) / WEIGHTS[j]
                    assert gap <= most[i] / WEIGHTS[i] + most[j] / WEIGHTS[j] + 1e-9, (i, j, first, last)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(push, min_size=1, max_size=60), st.lists(push, min_size=1, max_size=60))
def test_no_tenant_starves_behind_a_flood(flood, trickle):
    """However much one tenant queues first, another's request starts within a bounded number of starts."""
    queue: FairQueue[str] = FairQueue()
    for n, (_, cost) in enumerate(flood):
        queue.push(f"f{n}", "flood", cost, math.inf, float(n), "f", 1.0)
    previous = 0
    for n, (_, cost) in enumerate(trickle):
        queue.push(f"t{n}", "trickle", cost, math.inf, 1000.0 + n, "t", 1.0)
        flood_work = 0.0
        while (entry := queue.peek()) is not None:
            queue.take(entry.key)
            if entry.tenant == "trickle":
                break
            flood_work += entry.cost
        # Before each trickle request starts, the flood gets at most what the trickle got last (equal
        # weights) and one request of its own, however deep its backlog.
        assert flood_work <= previous + max(c for _, c in flood), (n, flood_work)
        previous = cost


def test_equal_weights_and_costs_alternate_whatever_the_backlog():
    queue: FairQueue[str] = FairQueue()
    for n in range(10):
        queue.push(f"n{n}", "noisy", 100, math.inf, n, "n")
    for n in range(3):
        queue.push(f"q{n}", "quiet", 100, math.inf, 10 + n, "q")
    order = []
    while (entry := queue.peek()) is not None:
        queue.take(entry.key)
        order.append(entry.tenant)
    assert order[:6] == ["noisy", "quiet"] * 3 or order[:6] == ["quiet", "noisy"] * 3
    assert order[6:] == ["noisy"] * 7, "work-conserving: the rest goes to whoever is left"


def test_a_tenant_at_its_cap_is_passed_over_and_never_blocks_the_others():
    queue: FairQueue[str] = FairQueue()
    queue.push("a1", "a", 10, math.inf, 0, "a1")
    queue.push("b1", "b", 10_000, math.inf, 1, "b1")
    assert queue.peek().tenant == "a"
    assert queue.peek(lambda tenant: tenant != "a").tenant == "b"
    assert queue.peek(lambda _: False) is None


def test_idleness_earns_no_credit():
    queue: FairQueue[str] = FairQueue()
    for n in range(20):
        queue.push(f"b{n}", "busy", 100, math.inf, n, "b")
    for _ in range(10):
        queue.take(queue.peek().key)
    # A tenant that sat idle while "busy" was served comes back level with it, not ten requests ahead.
    for n in range(5):
        queue.push(f"i{n}", "idle", 100, math.inf, 100 + n, "i")
    order = []
    for _ in range(4):
        entry = queue.peek()
        queue.take(entry.key)
        order.append(entry.tenant)
    assert order.count("busy") == 2 and order.count("idle") == 2


def test_removing_a_waiting_request_charges_nothing_and_settling_refunds():
    queue: FairQueue[str] = FairQueue()
    queue.push("x", "a", 500, math.inf, 0, "x")
    queue.remove("x")
    queue.push("y", "b", 100, math.inf, 1, "y")
    queue.push("z", "a", 100, math.inf, 2, "z")
    assert queue.peek().key == "y", "a's removed request did not count: tie broken by arrival"
    charge = queue.charge("a", 1000)
    assert charge is not None and queue.peek().key == "y"
    queue.settle(charge, 100)
    queue.take("y")
    assert queue.peek().key == "z", "the refund brought a level with b again"


def test_settling_charges_the_under_predicted_and_never_refunds_below_the_virtual_time():
    queue: FairQueue[str] = FairQueue()
    queue.push("b1", "b", 100, math.inf, 0, "b1")
    queue.push("b2", "b", 100, math.inf, 1, "b2")
    queue.push("a1", "a", 100, math.inf, 2, "a1")
    queue.push("a2", "a", 100, math.inf, 3, "a2")
    first = queue.take(queue.peek().key)
    assert first.key == "b1" and first.charge is not None
    queue.settle(first.charge, 1000)  # ran ten times longer than predicted
    order = []
    while (entry := queue.peek()) is not None:
        queue.take(entry.key)
        order.append(entry.key)
    assert order == ["a1", "a2", "b2"], "b paid for what it really used"
    queue.push("c", "c", 100, math.inf, 4, "c")
    queue.push("d", "d", 100, math.inf, 5, "d")
    taken = queue.take("c")
    queue.settle(taken.charge, 0)
    queue.settle(taken.charge, 0)
    assert queue._tenants.get("c") is None or queue._tenants["c"].tag >= queue.vtime, "no credit below the virtual time"


def test_a_charge_from_an_ended_busy_period_or_an_empty_queue_settles_nothing():
    queue: FairQueue[str] = FairQueue()
    assert queue.charge("a", 500) is None, "nobody contends: nothing charged, nothing to settle"
    queue.push("x", "x", 100, math.inf, 0, "x")
    stale = queue.charge("a", 500)
    assert stale is not None
    assert queue.take("x").charge is None, "taking the last entry ends the busy period"
    queue.push("b1", "b", 100, math.inf, 1, "b1")
    queue.push("a1", "a", 100, math.inf, 2, "a1")
    queue.push("a2", "a", 100, math.inf, 2, "a2")
    queue.take("b1")
    queue.settle(stale, 5000)
    assert queue.peek().key == "a1", "a debt of a busy period that ended is not collected in the next one"


def test_state_is_bounded_by_the_tenants_of_the_busy_period():
    queue: FairQueue[str] = FairQueue()
    queue.push("keep", "steady", 100, math.inf, 0, "k")
    for n in range(1000):
        queue.push(f"r{n}", f"t{n}", 100, math.inf, n, "r")
        queue.take(f"r{n}")
    assert len(queue._tenants) == 1001, "debts are kept while the queue is busy"
    queue.take("keep")
    assert not queue._tenants, "an empty queue ends the busy period"


def test_without_fairness_the_earliest_deadline_goes_first_whoever_queued_it():
    queue: FairQueue[str] = FairQueue(fair=False)
    for n in range(5):
        queue.push(f"n{n}", "noisy", 100, 10.0 + n, n, "n")
    queue.push("q", "quiet", 100, 20.0, 5, "q")
    order = []
    while (entry := queue.peek()) is not None:
        queue.take(entry.key)
        order.append(entry.key)
    assert order == ["n0", "n1", "n2", "n3", "n4", "q"]
    assert queue.ahead("quiet", 20.0) == 0


def test_ahead_counts_only_what_the_tags_put_first():
    queue: FairQueue[str] = FairQueue()
    for n in range(50):
        queue.push(f"n{n}", "noisy", 100, math.inf, n, "n")
    assert queue.ahead("noisy", math.inf) == 50
    assert queue.ahead("quiet", math.inf) <= 1, "a new tenant waits for at most one of the flood"


# Lanes: a turn continuing a paused agent session (lane 0) starts before the line's other requests,
# at most ``burst`` in a row while another waits.
lane_push = st.tuples(st.sampled_from(["a", "b"]), st.sampled_from([CONTINUING, NEW]), st.integers(1, 400))
lane_step = st.one_of(lane_push, st.just("start"), st.just("start"))


def run_lanes(steps, burst, fair=True):
    """Play ``steps``; per start: (entry started, the NEW entries of its tenant's line waiting just before)."""
    queue: FairQueue[str] = FairQueue(fair, burst)
    waiting: dict[str, list] = {}
    served = []
    for n, op in enumerate(steps):
        if op == "start":
            entry = queue.peek()
            if entry is None:
                continue
            line = entry.tenant if fair else ""
            before = [e for e in waiting.get(line, []) if e.lane == NEW]
            assert queue.take(entry.key) is entry
            waiting[line].remove(entry)
            served.append((entry, before))
        else:
            tenant, lane, cost = op
            entry = queue.push(f"r{n}", tenant, cost, math.inf, float(n), f"r{n}", WEIGHTS[tenant], lane=lane)
            waiting.setdefault(tenant if fair else "", []).append(entry)
    return served


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(lane_step, min_size=1, max_size=150), st.integers(0, 5), st.booleans())
def test_continuing_turns_go_first_but_never_more_than_burst_in_a_row_past_a_waiting_request(steps, burst, fair):
    served = run_lanes(steps, burst, fair)
    in_a_row: dict[str, int] = {}
    for entry, waiting_new in served:
        line = entry.tenant if fair else ""
        if entry.lane == NEW:
            in_a_row[line] = 0
            # The line's other requests start in arrival order (their deadlines are all the same).
            assert entry is min(waiting_new, key=lambda e: e.arrival)
        elif waiting_new:
            in_a_row[line] = in_a_row.get(line, 0) + 1
            assert in_a_row[line] <= burst, "a new session's request waited past more than burst continuing turns"
        else:
            in_a_row[line] = 0


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(lane_step, min_size=1, max_size=150), st.integers(0, 5))
def test_a_request_of_the_new_lane_starts_within_its_position_times_burst_plus_one_starts_of_its_line(steps, burst):
    served = run_lanes(steps, burst)
    # The documented bound: the k-th request of its lane (k = 1 for the head) starts within k x (burst + 1)
    # starts of its tenant's line, counted from its push.
    pushed_at: dict[str, tuple[int, int]] = {}
    starts: dict[str, int] = {}
    for entry, waiting_new in served:
        line = entry.tenant
        starts[line] = starts.get(line, 0) + 1
        for e in waiting_new:
            if e.key not in pushed_at:
                k = 1 + sum(1 for other in waiting_new if other.arrival < e.arrival)
                pushed_at[e.key] = (starts[line] - 1, k)
        if entry.lane == NEW and entry.key in pushed_at:
            first_seen, k = pushed_at[entry.key]
            assert starts[line] - first_seen <= k * (burst + 1)


def test_continuing_turns_first_within_a_tenant_and_fair_shares_across_tenants():
    queue: FairQueue[str] = FairQueue(True, burst=2)
    for i in range(3):
        queue.push(f"new{i}", "a", 100, math.inf, float(i), "", 1.0, lane=NEW)
    for i in range(4):
        queue.push(f"cont{i}", "a", 100, math.inf, 10.0 + i, "", 1.0, lane=CONTINUING)
    order = []
    while (entry := queue.peek()) is not None:
        order.append(entry.key)
        queue.take(entry.key)
    assert order == ["cont0", "cont1", "new0", "cont2", "cont3", "new1", "new2"]
