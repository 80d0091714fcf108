"""The limits: and upstream deadline settings: parsing and the deadline of one attempt."""

from __future__ import annotations

import pytest

from priority_gateway.config import ConfigError, UpstreamConfig, parse_config
from priority_gateway.config.limits import ClientLimits
from priority_gateway.core.classes import Budget

POOLS = {"pools": {"interactive": {"engines": ["http://127.0.0.1:9"]}}}


def test_defaults_when_nothing_is_set():
    config = parse_config(POOLS)
    assert config.limits == ClientLimits()
    assert config.upstream == UpstreamConfig()


def test_values_are_read_and_typed():
    config = parse_config(
        {**POOLS, "limits": {"max_body_bytes": 2048, "openapi_public": True}, "upstream": {"min_deadline_s": 3}}
    )
    assert config.limits.max_body_bytes == 2048 and config.limits.openapi_public is True
    assert config.upstream.min_deadline_s == 3.0


def test_the_older_top_level_body_limit_is_still_read():
    assert parse_config({**POOLS, "max_body_bytes": 1000}).limits.max_body_bytes == 1000
    both = parse_config({**POOLS, "max_body_bytes": 1000, "limits": {"max_body_bytes": 2000}})
    assert both.limits.max_body_bytes == 2000


@pytest.mark.parametrize(
    "section",
    [
        {"limits": {"max_body_byte": 1}},
        {"limits": {"max_connections": 0}},
        {"limits": {"header_timeout_s": -1}},
        {"limits": {"metrics_public": "yes"}},
        {"upstream": {"first_byte_timeout_s": "soon"}},
    ],
)
def test_bad_values_are_refused(section):
    with pytest.raises(ConfigError):
        parse_config({**POOLS, **section})


INTERACTIVE = Budget(ttft_s=0.5, itl_s=0.05)


def test_an_interactive_deadline_follows_its_budgets_and_max_tokens():
    deadlines = UpstreamConfig(deadline_factor=4.0, min_deadline_s=10.0, max_interactive_s=300.0)
    assert deadlines.attempt_s(INTERACTIVE, 1000, 0.0, 0.0) == pytest.approx(4.0 * (0.5 + 1000 * 0.05))
    assert deadlines.attempt_s(INTERACTIVE, 8, 0.0, 0.0) == 10.0
    assert deadlines.attempt_s(INTERACTIVE, 100_000, 0.0, 0.0) == 300.0
    assert deadlines.attempt_s(INTERACTIVE, None, 0.0, 0.0) == 300.0


def test_a_batch_deadline_counts_from_arrival():
    batch = Budget(deadline_s=100.0)
    assert UpstreamConfig().attempt_s(batch, 10, arrival=5.0, now=45.0) == 60.0
    assert UpstreamConfig().attempt_s(batch, 10, arrival=5.0, now=500.0) == 0.0
