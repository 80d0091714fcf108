"""Who must leave a pool's reserve to the others, and whose cap binds: ``TenantFairness``."""

from __future__ import annotations

from priority_gateway.core.classes import Budget
from priority_gateway.core.fairness import PEER_HOLD_S, TenantFairness
from priority_gateway.core.queue import WaitQueue
from priority_gateway.core.request import RouteRequest


class Others:
    """What the other replicas report of their tenants (``fairness.FleetTenants``)."""

    def __init__(self, pools: dict[str, dict[str, tuple[int, int, float]]] | None = None) -> None:
        self.pools = pools or {}

    def tenants_of(self, pool: str) -> dict[str, tuple[int, int, float]]:
        return dict(self.pools.get(pool, {}))

    def tenant_running(self, tenant: str) -> int:
        return sum(t[tenant][0] for t in self.pools.values() if tenant in t)

    @property
    def has_tenants(self) -> bool:
        return bool(self.pools)


def fairness(others: Others | None = None, **running: int) -> TenantFairness:
    tenants = TenantFairness(others or Others())
    for tenant, n in running.items():
        for _ in range(n):
            tenants.started(tenant, None, 1.0, "p")
    return tenants


def queue(**waiting: float) -> WaitQueue:
    q = WaitQueue()
    for tenant, weight in waiting.items():
        q.push(
            RouteRequest(f"{tenant}-w", "interactive", "m", 0.0, 10, budget=Budget(), tenant=tenant, weight=weight),
            1e9,
            0.0,
        )
    return q


def test_a_tenant_alone_is_never_over_its_share():
    assert not fairness(noisy=12).over("p", queue(), 8, None)("noisy")


def test_at_its_share_a_tenant_leaves_the_reserve_to_one_under_its_share_that_waits():
    # Eight slots, two tenants: four each. "a" holds its four; "b", under its share, waits.
    over = fairness(a=4, b=1).over("p", queue(b=1.0), 8, None)
    assert over("a") and not over("b")


def test_a_tenant_at_its_share_is_not_held_back_for_one_that_holds_more():
    # Twelve slots, three tenants: four each. "burst" reached its four while "noisy" holds six:
    # nobody under its share waits, so "burst" may take the room "noisy" must leave.
    over = fairness(burst=4, noisy=6, quiet=1).over("p", queue(burst=1.0, noisy=1.0), 12, None)
    assert over("noisy") and not over("burst") and not over("quiet")
    # Holding as much as the most, it leaves the reserve alone too.
    over = fairness(burst=6, noisy=6).over("p", queue(burst=1.0, noisy=1.0), 12, None)
    assert over("burst") and over("noisy")


def test_a_queued_tenant_counts_with_the_weight_its_requests_carry():
    # "heavy" (weight 3) has nothing running but waits: "light" holds one of its one of four slots.
    over = fairness(light=1).over("p", queue(heavy=3.0), 4, None)
    assert over("light") and not over("heavy")


def test_other_replicas_tenants_count_in_the_shares():
    # Here "noisy" alone runs three of eight slots; another replica runs "quiet" on three and has
    # one more of it waiting: shares are four each, and "noisy" leaves the rest to "quiet".
    assert not fairness(noisy=3).over("p", queue(), 8, None)("noisy"), "on its own, alone"
    others = Others({"p": {"quiet": (3, 1, 1.0)}})
    assert not fairness(others, noisy=3).over("p", queue(), 8, None)("noisy"), "three of its four"
    assert fairness(others, noisy=4).over("p", queue(), 8, None)("noisy"), "its four, while quiet waits elsewhere"


def test_room_is_left_to_another_replicas_tenant_further_below_its_share_for_a_while_only():
    others = Others({"p": {"there": (0, 3, 2.0)}})
    tenants = fairness(others, here=1)
    waiting = queue(here=1.0)
    assert tenants.over("p", waiting, 4, 0.0)("here"), "there is at 0 of its share: here gives way"
    tenants.giving_way("p", True, 0.0)
    assert tenants.over("p", waiting, 4, PEER_HOLD_S / 2)("here")
    assert not tenants.over("p", waiting, 4, PEER_HOLD_S)("here"), "nobody took it: work-conserving again"


def test_a_cap_counts_the_tenants_requests_on_every_replica_and_a_tenant_with_nothing_running_is_forgotten():
    others = Others({"p": {"capped": (1, 0, 1.0)}})
    tenants = TenantFairness(others)
    tenants.started("capped", 2, 1.0, "p")
    assert not tenants.has_room("capped"), "one here, one on another replica: at its cap of two"
    tenants.finished("capped", "p")
    assert tenants.inflight == {} and tenants.has_room("capped")


def test_without_fairness_nobody_is_over_a_share():
    tenants = TenantFairness(Others(), enabled=False)
    for _ in range(9):
        tenants.started("noisy", None, 1.0, "p")
    tenants.started("quiet", None, 1.0, "p")
    assert not tenants.over("p", queue(quiet=1.0), 10, None)("noisy")
