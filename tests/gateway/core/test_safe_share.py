"""The safe share: how many replicas split a limit while the channel is down, and when it ends."""

from priority_gateway.core.safe_share import SafeShare


def test_the_replicas_heard_lately_split_the_limit_and_the_count_holds_through_the_outage():
    share = SafeShare(window_s=30.0, settle_s=1.0)
    share.heard(b"a", 0.0)
    share.heard(b"b", 50.0)
    share.heard(b"c", 55.0)
    assert share.share(8) == 8  # not lost: no split
    assert share.lost(60.0)
    assert not share.lost(61.0)  # entered once
    assert share.replicas == 3  # b, c and this one; a was heard too long ago
    assert share.share(8) == 2  # floor(8 / 3)
    assert share.share(2) == 1  # never nothing
    assert share.replicas == 3  # a long outage keeps the count it started with


def test_the_fallback_ends_only_once_settled_after_the_channel_is_back():
    share = SafeShare(window_s=30.0, settle_s=1.0)
    share.heard(b"b", 0.0)
    share.lost(1.0)
    assert not share.settle(5.0)  # still down
    share.resumed(10.0)
    assert not share.settle(10.5) and share.safe
    assert share.settle(11.0) and not share.safe
    assert share.share(8) == 8
    share.lost(12.0)
    share.resumed(13.0)
    share.lost(13.5)  # lost again before settling: the resume does not count
    assert not share.settle(20.0) and share.safe


def test_remembered_publishers_are_bounded():
    share = SafeShare(max_peers=4)
    for n in range(100):
        share.heard(n.to_bytes(16, "big"), float(n))
    assert share.seen(100.0) == 5
