"""The channel's states and the safe share that is their rule while the channel cannot be trusted."""

from priority_gateway.core.fleet.channel import Channel, State


def test_a_replica_starts_in_its_safe_share_counting_the_replicas_as_it_hears_them():
    channel = Channel(settle_s=1.0)
    assert channel.state is State.STARTING and channel.safe and not channel.works
    channel.seen(3)
    channel.seen(2)  # never fewer than heard so far
    assert channel.replicas == 3 and channel.share(8) == 2
    channel.up(10.0)
    assert channel.works and channel.safe
    assert not channel.settle(10.5)
    assert not channel.settle(11.0), "a start ends silently: nothing was lost"
    assert channel.state is State.UP and not channel.safe and channel.share(8) == 8


def test_a_loss_fixes_the_count_and_the_share_ends_only_once_settled_after_the_channel_is_back():
    channel = Channel(settle_s=1.0, shared=False)  # up from the start
    assert channel.lost(3)
    assert not channel.lost(5), "entered once"
    assert channel.replicas == 3  # the count the outage started with, however long it lasts
    channel.seen(5)
    assert channel.replicas == 3
    assert channel.share(8) == 2 and channel.share(2) == 1, "floor(limit / replicas), never nothing"
    assert not channel.settle(5.0), "still down"
    channel.up(10.0)
    assert not channel.settle(10.5) and channel.safe
    assert channel.settle(11.0) and not channel.safe, "the end of a loss is said"
    channel.lost(2)
    channel.up(13.0)
    channel.lost(2)  # lost again before settling: the return does not count
    assert not channel.settle(20.0) and channel.safe and channel.state is State.DOWN


def test_a_replica_that_heard_nobody_keeps_the_whole_limit():
    channel = Channel(shared=False)
    channel.lost(1)
    assert channel.share(4) == 4
