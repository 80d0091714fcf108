"""Classes beyond two, tenant fair shares and concurrency caps, as the dispatcher applies them."""

from priority_gateway.core.classes import BATCH, INTERACTIVE, Budget, ClassSpec, ClassTable
from priority_gateway.core.dispatcher import AdmissionSettings, Dispatch, Dispatcher, PoolSpec, Queued, Rejection
from priority_gateway.core.limiter import LimitSettings
from priority_gateway.core.request import RouteRequest

FOUR = ClassTable(
    [
        ClassSpec("realtime", 0),
        ClassSpec(INTERACTIVE, 1),
        ClassSpec("standard", 2),
        ClassSpec(BATCH, 3, BATCH),
    ]
)
counter = iter(range(10**6))


def make(engines=1, limit=1.0, fair=True, classes=FOUR, max_queue=1000, takes_priority=True):
    settings = AdmissionSettings(
        enabled=True, limits=LimitSettings(initial=limit, unbudgeted=limit), max_queue=max_queue, fair=fair
    )
    pools = [PoolSpec("p", [f"e{n}" for n in range(engines)], policy="least_loaded", takes_priority=takes_priority)]
    return Dispatcher(pools, admission=settings, classes=classes)


def req(tenant="", cls=INTERACTIVE, now=0.0, weight=1.0, cap=None, tokens=100):
    return RouteRequest(
        f"r{next(counter)}",
        cls,
        "m",
        now,
        prompt_tokens=tokens,
        max_tokens=tokens,
        budget=Budget(deadline_s=1000.0),
        tenant=tenant,
        weight=weight,
        max_concurrency=cap,
    )


def serve(d, first, rounds):
    """Finish what runs, one at a time, and return the tenants in the order they started."""
    order = []
    running = first
    for n in range(rounds):
        started = [o for o in d.finish(running, float(n + 1)) if isinstance(o, Dispatch)]
        if not started:
            break
        running = started[0]
        order.append(running.request.tenant)
    return order


def test_every_class_sends_its_own_priority_and_the_queue_follows_rank():
    d = make()
    busy = d.submit(req(cls=BATCH), 0.0).answer
    assert isinstance(busy, Dispatch) and busy.priority == 3
    for cls in (BATCH, "standard", INTERACTIVE, "realtime"):
        assert isinstance(d.submit(req(cls, cls=cls), 0.0).answer, Queued)
    order = []
    running = busy
    for n in range(4):
        (running,) = [o for o in d.finish(running, float(n + 1)) if isinstance(o, Dispatch)]
        order.append((running.request.cls, running.priority))
    assert order == [("realtime", 0), (INTERACTIVE, 1), ("standard", 2), (BATCH, 3)]


def test_no_priority_is_written_for_a_pool_that_does_not_take_it():
    d = make(takes_priority=False)
    out = d.submit(req(cls="realtime"), 0.0).answer
    assert isinstance(out, Dispatch) and out.priority is None


def test_a_noisy_tenant_gets_its_share_not_the_queue():
    d = make()
    first = d.submit(req("noisy"), 0.0).answer
    for _ in range(30):
        d.submit(req("noisy"), 0.0)
    for tenant in ("a", "b", "c"):
        for _ in range(3):
            d.submit(req(tenant), 0.1)
    order = serve(d, first, 12)
    # Four tenants of equal weight: the noisy one gets one start in four while the others wait.
    assert order.count("noisy") == 3
    assert all(order.count(t) == 3 for t in ("a", "b", "c"))


def test_without_fairness_the_noisy_tenant_that_came_first_goes_first():
    d = make(fair=False)
    first = d.submit(req("noisy"), 0.0).answer
    for _ in range(30):
        d.submit(req("noisy"), 0.0)
    d.submit(req("a"), 0.1)
    assert serve(d, first, 12) == ["noisy"] * 12


def test_weights_set_the_shares():
    d = make()
    first = d.submit(req("heavy", weight=3.0), 0.0).answer
    for _ in range(40):
        d.submit(req("heavy", weight=3.0), 0.0)
        d.submit(req("light", weight=1.0), 0.0)
    order = serve(d, first, 40)
    assert order.count("heavy") == 30 and order.count("light") == 10


def test_a_tenant_at_its_cap_waits_while_others_use_the_room():
    d = make(engines=4, limit=1.0)
    capped = [d.submit(req("capped", cap=2), 0.0).answer for _ in range(3)]
    assert [type(o) for o in capped] == [Dispatch, Dispatch, Queued]
    other = d.submit(req("other"), 0.0).answer
    assert isinstance(other, Dispatch), "work-conserving: the cap holds back only its own tenant"
    free = d.submit(req("other"), 0.0).answer
    assert isinstance(free, Dispatch)
    # A slot frees up: the capped tenant's queued request starts only once one of its own ends.
    d.finish(free, 1.0)
    started = [o for o in d.finish(other, 1.0) if isinstance(o, Dispatch)]
    assert started == []
    started = [o for o in d.finish(capped[0], 2.0) if isinstance(o, Dispatch)]
    assert [o.request for o in started] == [capped[2].request]


def test_a_full_queue_sheds_the_heaviest_batch_tenant_first():
    d = make(max_queue=4)
    d.submit(req(cls=BATCH), 0.0)
    for _ in range(3):
        d.submit(req("flood", cls=BATCH), 0.0)
    light = d.submit(req("light", cls=BATCH), 0.0).answer
    assert isinstance(light, Queued)
    decided = d.submit(req("someone", cls="realtime"), 0.0)
    assert isinstance(decided.answer, Queued)
    shed = [o for o in decided.others if isinstance(o, Rejection)]
    assert [o.request.tenant for o in shed] == ["flood"]


def test_a_tenant_over_its_share_leaves_the_others_room_but_takes_everything_alone():
    d = Dispatcher(
        [PoolSpec("p", ["e0", "e1", "e2", "e3"], policy="least_loaded")],
        admission=AdmissionSettings(enabled=True, limits=LimitSettings(initial=2.0, unbudgeted=2.0), fair=True),
        classes=FOUR,
    )
    # Alone, the noisy tenant fills all eight slots: work-conserving.
    alone = [d.submit(req("noisy"), 0.0).answer for _ in range(8)]
    assert all(isinstance(o, Dispatch) for o in alone)
    for n, dispatch in enumerate(alone):
        d.finish(dispatch, 1.0 + n)
    # With another tenant active, past its half of the slots it starts only where an engine keeps
    # a slot spare ...
    quiet = d.submit(req("quiet"), 10.0).answer
    assert isinstance(quiet, Dispatch)
    noisy = [d.submit(req("noisy"), 10.0).answer for _ in range(8)]
    assert sum(isinstance(o, Dispatch) for o in noisy) == 4, "its half of the eight slots"
    # ... and the other tenant's next requests find the room it left.
    assert isinstance(d.submit(req("quiet"), 10.1).answer, Dispatch)
    assert isinstance(d.submit(req("quiet"), 10.2).answer, Dispatch)


def test_without_fairness_the_noisy_tenant_takes_every_slot():
    d = Dispatcher(
        [PoolSpec("p", ["e0", "e1"], policy="least_loaded")],
        admission=AdmissionSettings(enabled=True, limits=LimitSettings(initial=4.0, unbudgeted=4.0), fair=False),
        classes=FOUR,
    )
    assert isinstance(d.submit(req("quiet"), 0.0).answer, Dispatch)
    noisy = [d.submit(req("noisy"), 0.0).answer for _ in range(8)]
    assert sum(isinstance(o, Dispatch) for o in noisy) == 7
    assert isinstance(d.submit(req("quiet"), 0.1).answer, Queued)


def test_a_request_that_ends_early_is_charged_what_it_used_not_its_max_tokens():
    d = make()
    busy = d.submit(req("b"), 0.0).answer
    long = req("a")
    long.max_tokens = 2000
    assert isinstance(d.submit(long, 0.0).answer, Queued)
    for _ in range(8):
        d.submit(req("b"), 0.0)
    d.submit(req("a"), 0.0)
    (started,) = [o for o in d.finish(busy, 1.0) if isinstance(o, Dispatch)]
    assert started.request is long and started.charge is not None
    # It stopped after 10 of its 2000 tokens: "a" paid 110 tokens, not 2100, and its next
    # request comes right after one of "b"'s instead of after all eight.
    (running,) = [o for o in d.finish(started, 2.0, generated=10) if isinstance(o, Dispatch)]
    order = [running.request.tenant, *serve(d, running, 8)]
    assert order[:2] == ["b", "a"], order


def test_a_retried_attempt_is_not_charged_twice():
    d = make()
    busy = d.submit(req("c"), 0.0).answer
    a1, b1, b2, a2 = (req(t) for t in "abba")
    for r in (a1, b1, b2, a2):
        assert isinstance(d.submit(r, 0.0).answer, Queued)
    (first,) = [o for o in d.finish(busy, 1.0) if isinstance(o, Dispatch)]
    assert first.request is a1 and first.charge is not None
    # The engine refused the connection: a1 goes back to the queue with its charge refunded, so
    # the slot after b1's is "a"'s again (charged twice, "a" would wait behind b2).
    decided = d.retry(first, 1.5)
    assert isinstance(decided.answer, Queued)
    (running,) = [o for o in decided.others if isinstance(o, Dispatch)]
    assert running.request is b1
    (again,) = [o for o in d.finish(running, 2.0) if isinstance(o, Dispatch)]
    assert again.request.tenant == "a"


def test_an_engine_reporting_more_tokens_than_max_tokens_allows_charges_no_more_than_max_tokens():
    d = make()
    busy = d.submit(req("b"), 0.0).answer
    first = req("a")
    assert isinstance(d.submit(first, 0.0).answer, Queued)
    for _ in range(8):
        d.submit(req("b"), 0.0)
    d.submit(req("a"), 0.0)
    (started,) = [o for o in d.finish(busy, 1.0) if isinstance(o, Dispatch)]
    assert started.request is first
    # A broken engine's usage says 10**12 tokens for a request of max_tokens 100: charged that, "a"
    # would wait behind every request "b" will ever queue.
    (running,) = [o for o in d.finish(started, 2.0, generated=10**12) if isinstance(o, Dispatch)]
    order = [running.request.tenant, *serve(d, running, 8)]
    assert "a" in order[:3], order
