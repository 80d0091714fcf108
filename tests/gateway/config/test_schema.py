"""Building typed settings from YAML data: types, limits, null, text from outside YAML."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

import pytest
from annotated_types import Ge, Interval

from priority_gateway.config.schema import ConfigError, Raw, build, describe


@dataclass(frozen=True, slots=True)
class Inner:
    """A section inside a section."""

    size: Annotated[int, Ge(1)] = 4
    """Size."""


@dataclass(frozen=True, slots=True)
class Sample:
    """Every kind of field."""

    count: int = 1
    """A count."""
    ratio: Annotated[float, Interval(ge=0, le=1)] = 0.5
    """A share."""
    name: str = "x"
    """A name."""
    secret: str | None = None
    """A secret."""
    flag: bool = False
    """A flag."""
    mode: Literal["auto", "manual"] = "auto"
    """A choice."""
    hosts: list[str] = field(default_factory=list)
    """Hosts."""
    labels: dict[str, str] = field(default_factory=dict)
    """Labels."""
    inner: Inner = field(default_factory=lambda: Inner(size=8))
    """A section."""


def test_given_keys_replace_the_defaults_and_the_rest_stay():
    sample = build(Sample, {"count": 3, "inner": {}})
    assert (sample.count, sample.ratio, sample.inner.size) == (3, 0.5, 8)


def test_numbers_are_not_booleans_and_integers_are_whole():
    assert build(Sample, {"ratio": 1}).ratio == 1.0
    assert build(Sample, {"count": 2.0}).count == 2
    for data, message in (
        ({"count": True}, "count: expected an integer, got true"),
        ({"count": 2.5}, "count: expected an integer, got 2.5"),
        ({"ratio": False}, "ratio: expected a number >= 0, <= 1, got false"),
        ({"flag": 1}, "flag: expected a boolean, got 1"),
        ({"name": 7}, "name: expected a string (quote it), got 7"),
        ({"hosts": [1]}, "hosts[0]: expected a string (quote it), got 1"),
        ({"labels": {"a": 1}}, "labels.a: expected a string (quote it), got 1"),
        ({"labels": {1: "a"}}, "labels: keys must be strings, got 1"),
        ({"inner": {"size": 0}}, "inner.size: must be >= 1, got 0"),
        ({"inner": 3}, "inner: expected a section (a mapping of keys to values), got 3"),
        ({"mode": "sometimes"}, "mode: expected one of 'auto', 'manual', got 'sometimes'"),
    ):
        with pytest.raises(ConfigError) as refused:
            build(Sample, data)
        assert str(refused.value) == message


def test_null_is_none_where_allowed_else_the_default():
    sample = build(Sample, {"secret": None, "count": None, "inner": None})
    assert (sample.secret, sample.count, sample.inner) == (None, 1, Inner(size=8))


def test_a_list_may_be_given_as_its_one_item():
    assert build(Sample, {"hosts": "a"}).hosts == ["a"]


def test_text_from_outside_yaml_is_read_for_its_type_and_names_its_source():
    sample = build(
        Sample,
        {
            "count": Raw("12", "COUNT"),
            "name": Raw("0123", "NAME"),
            "secret": Raw("true", "SECRET"),
            "flag": Raw("yes", "FLAG"),
            "hosts": Raw('["a", "b"]', "HOSTS"),
            "inner": Raw("{size: 2}", "INNER"),
        },
    )
    assert (sample.count, sample.name, sample.secret, sample.flag) == (12, "0123", "true", True)
    assert (sample.hosts, sample.inner.size) == (["a", "b"], 2)
    assert build(Sample, {"count": Raw("", "COUNT"), "secret": Raw("", "SECRET")}) == Sample()
    with pytest.raises(ConfigError) as refused:
        build(Sample, {"inner": Raw("{size: 0}", "INNER")})
    assert str(refused.value) == "INNER: inner.size: must be >= 1, got 0"
    with pytest.raises(ConfigError) as refused:
        build(Sample, {"count": Raw("[1", "COUNT")})
    assert str(refused.value).startswith("COUNT: count: not a YAML value")


@dataclass(frozen=True, slots=True)
class Range:
    """A range."""

    low: int = 0
    """Low."""
    high: int = 10
    """High."""

    def validated(self) -> Range:
        if self.low > self.high:
            raise ConfigError("must not exceed high", ["low"])
        return self


@dataclass(frozen=True, slots=True)
class Outer:
    """Holds a range."""

    range: Range = field(default_factory=Range)
    """The range."""


def test_rules_across_keys_get_the_sections_path():
    with pytest.raises(ConfigError) as refused:
        build(Outer, {"range": {"low": 11}})
    assert str(refused.value) == "range.low: must not exceed high"


def test_types_in_words():
    assert describe(Annotated[int, Interval(ge=1, le=9)] | None) == "integer >= 1, <= 9 or null"
    assert describe(list[str]) == "list of strings"
    assert describe(bool | Literal["auto"], article=True) == "a boolean or 'auto'"
