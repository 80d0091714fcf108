"""Who must leave a pool's reserve to the others: ``TenantLoad.over_share``."""

from priority_gateway.core.tenants import TenantLoad


def load(pool: str = "p", **running: int) -> TenantLoad:
    tenants = TenantLoad()
    for tenant, n in running.items():
        for _ in range(n):
            tenants.started(tenant, None, 1.0, pool)
    return tenants


def test_a_tenant_alone_is_never_over_its_share():
    over = load(noisy=12).over_share("p", 8, {})
    assert not over("noisy")


def test_at_its_share_a_tenant_leaves_the_reserve_to_one_under_its_share_that_waits():
    # Eight slots, two tenants: four each. "a" holds its four; "b", under its share, waits.
    over = load(a=4, b=1).over_share("p", 8, {"b": 1.0})
    assert over("a") and not over("b")


def test_a_tenant_at_its_share_is_not_held_back_for_one_that_holds_more():
    # Twelve slots, three tenants: four each. "burst" reached its four while "noisy" holds six:
    # nobody under its share waits, so "burst" may take the room "noisy" must leave.
    over = load(burst=4, noisy=6, quiet=1).over_share("p", 12, {"burst": 1.0, "noisy": 1.0})
    assert over("noisy")
    assert not over("burst")
    assert not over("quiet")
    # Holding as much as the most, it leaves the reserve alone too.
    over = load(burst=6, noisy=6, quiet=0).over_share("p", 12, {"burst": 1.0, "noisy": 1.0})
    assert over("burst") and over("noisy")


def test_a_queued_tenant_counts_with_the_weight_its_requests_carry():
    # "heavy" (weight 3) has nothing running but waits: "light" holds one of its one of four slots.
    over = load(light=1).over_share("p", 4, {"heavy": 3.0})
    assert over("light")
    assert not over("heavy")


def test_other_replicas_tenants_count_in_the_shares():
    # Here "noisy" alone runs three of eight slots; another replica runs "quiet" on four and has
    # one more of it waiting: shares are four each, and "noisy" leaves the rest to "quiet".
    tenants = load(noisy=3)
    assert not tenants.over_share("p", 8, {})("noisy"), "on its own, alone"
    over = tenants.over_share("p", 8, {}, {"quiet": (3, 1, 1.0)})
    assert not over("noisy"), "three of its four"
    over = load(noisy=4).over_share("p", 8, {}, {"quiet": (3, 1, 1.0)})
    assert over("noisy"), "its four, while quiet, under its share, waits elsewhere"
