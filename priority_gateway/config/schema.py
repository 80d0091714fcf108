"""Settings classes are the schema: typed values built from YAML data, refused with the key's path.

Rules:
- A settings class is a frozen dataclass whose every field has a default, followed by an
  attribute docstring that says what the setting means; ``docs/configuration.md`` is generated
  from them (``gateway config reference``).
- A field's type says what its value may be: ``bool``, ``int``, ``float``, ``str``, ``Literal``
  choices, ``X | None``, ``list[X]``, ``dict[str, X]`` or another settings class. ``Annotated``
  adds limits (annotated_types' ``Gt``, ``Ge``, ``Lt``, ``Le``, ``Interval``) or a ``Check``.
- Keys given replace the defaults, also inside a section (``classes: {interactive: {pool: p}}``
  keeps the class's budgets). An unknown key, a wrong type or a value out of range is a
  ``ConfigError`` naming the key's path, and for an unknown key the nearest known one.
- ``null`` (or an empty value) means the default, or ``None`` where the type allows it.
- An open section (``OPEN_FIELD`` names one of its ``dict[str, X]`` fields) takes keys of its
  own choosing beside its fields (``classes: {realtime: {...}}``): they land in that field. A
  key spelt close to a field's name is still refused as a misspelling.
- A settings class may define ``validated(self) -> Self`` for rules across its keys; it may
  return a normalised copy, and its errors are paths relative to the section.
- Text from outside YAML (environment variables, command-line options) arrives as ``Raw``,
  which remembers where it came from: taken as written where a string is wanted, read as YAML
  otherwise, and named in the error when it does not fit.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar, Union, cast, get_args, get_origin, get_type_hints

import annotated_types
import yaml

T = TypeVar("T")

_MISSING: Any = object()


class ConfigError(ValueError):
    """A configuration the gateway refuses: ``[source: ]path: message`` on one line."""

    def __init__(self, message: str, path: Sequence[str] = (), source: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.path = tuple(path)
        self.source = source

    def under(self, prefix: Sequence[str]) -> ConfigError:
        return ConfigError(self.message, (*prefix, *self.path), self.source)

    def from_source(self, source: str) -> ConfigError:
        """The same error, said to come from ``source`` unless it already names one."""
        return self if self.source else ConfigError(self.message, self.path, source)

    def __str__(self) -> str:
        parts = [part for part in (self.source, dotted(self.path)) if part]
        return ": ".join([*parts, self.message])


def dotted(path: Sequence[str]) -> str:
    return "".join(part if part.startswith("[") or i == 0 else "." + part for i, part in enumerate(path))


@dataclass(frozen=True, slots=True)
class Check:
    """A rule a value must pass beyond its type, e.g. a URL scheme."""

    test: Callable[[Any], bool]
    expected: str
    """What a passing value is, for the error: ``an http:// or https:// URL``."""


def starts_with(*prefixes: str, expected: str) -> Check:
    return Check(lambda value: isinstance(value, str) and value.startswith(prefixes), expected)


class Raw(str):
    """Text given outside YAML, with where it came from (``GATEWAY__LISTEN__PORT``, ``--port``)."""

    source: str

    def __new__(cls, text: str, source: str) -> Raw:
        raw = super().__new__(cls, text)
        raw.source = source
        return raw


# -- building ------------------------------------------------------------------------------


def build(cls: type[T], data: object, path: Sequence[str] = (), base: T | None = None) -> T:
    """A ``cls`` from ``data`` (a mapping, or None for the defaults), on top of ``base``."""
    start: T = base if base is not None else cls()
    if data is not None and not isinstance(data, Mapping):
        raise ConfigError(f"expected a section (a mapping of keys to values), got {shown(data)}", path)
    changes: dict[str, Any] = {}
    if data:
        hints = type_hints(cls)
        extra = open_field(cls)
        for key, value in data.items():
            if key not in hints:
                if extra is None or not isinstance(key, str) or misspelt(key, hints):
                    raise unknown_key(key, list(hints), path)
                more = changes.setdefault(extra, dict(getattr(start, extra)))
                _, item = get_args(section_of(hints[extra]))
                more[key] = convert(item, value, (*path, key), more.get(key, _MISSING))
                continue
            changes[key] = convert(hints[key], value, (*path, key), getattr(start, key))
    result = dataclasses.replace(start, **changes) if changes else start  # type: ignore[type-var]
    validated = getattr(result, "validated", None)
    if validated is not None:
        try:
            result = cast(T, validated())
        except ConfigError as exc:
            raise exc.under(path) from None
    return result


def convert(tp: Any, value: object, path: Sequence[str], current: Any = _MISSING) -> Any:
    """``value`` as type ``tp``; ``current`` is what stands when the value is null."""
    if isinstance(value, Raw):
        try:
            return convert(tp, _read_raw(tp, value, path), path, current)
        except ConfigError as exc:
            raise exc.from_source(value.source) from None
    if value is None:
        if allows_none(tp):
            return None
        if current is not _MISSING:
            return current
        raise ConfigError(f"expected {describe(tp, article=True)}, got null", path)
    origin = get_origin(tp)
    if origin is Annotated:
        base, *metadata = get_args(tp)
        # A scalar of the wrong type is told what it should be, limits included.
        result = _convert_scalar(base, value, path, tp) if base in _NOUNS else convert(base, value, path, current)
        for rule in limits(metadata):
            problem = _broken(rule, result)
            if problem:
                raise ConfigError(problem, path)
        return result
    if origin in (Union, types.UnionType):
        return _convert_union(tp, value, path, current)
    if origin is Literal:
        return _convert_choice(tp, value, path)
    if origin is list:
        (item,) = get_args(tp)
        items = value if isinstance(value, list | tuple) else [value]
        return [convert(item, v, (*path, f"[{i}]")) for i, v in enumerate(items)]
    if origin is dict:
        _, item = get_args(tp)
        if not isinstance(value, Mapping):
            raise ConfigError(f"expected a mapping, got {shown(value)}", path)
        out: dict[str, Any] = {}
        for key, v in value.items():
            if not isinstance(key, str):
                raise ConfigError(f"keys must be strings, got {shown(key)}", path)
            out[key] = convert(item, v, (*path, key))
        return out
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return build(tp, value, path, current if isinstance(current, tp) else None)
    return _convert_scalar(tp, value, path)


def _convert_scalar(tp: Any, value: object, path: Sequence[str], described: Any = None) -> Any:
    if tp is bool and isinstance(value, bool):
        return value
    if tp is int and not isinstance(value, bool):
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if tp is str and isinstance(value, str):
        return value
    if tp not in (bool, int, float, str):
        raise TypeError(f"settings field type {tp!r} is not supported")
    hint = " (quote it)" if tp is str and isinstance(value, int | float | bool) else ""
    raise ConfigError(f"expected {describe(described or tp, article=True)}{hint}, got {shown(value)}", path)


def _convert_union(tp: Any, value: object, path: Sequence[str], current: Any) -> Any:
    arms = [arm for arm in get_args(tp) if arm is not type(None)]
    if len(arms) == 1:
        return convert(arms[0], value, path, current)
    for arm in arms:
        try:
            return convert(arm, value, path, current)
        except ConfigError:
            continue
    raise ConfigError(f"expected {describe(tp, article=True)}, got {shown(value)}", path)


def _convert_choice(tp: Any, value: object, path: Sequence[str]) -> Any:
    for choice in get_args(tp):
        if type(value) is type(choice) and value == choice:
            return choice
        if isinstance(choice, str) and isinstance(value, str) and value.lower() == choice:
            return choice
    raise ConfigError(f"expected {describe(tp, article=True)}, got {shown(value)}", path)


def _read_raw(tp: Any, raw: Raw, path: Sequence[str]) -> object:
    text = str(raw)
    if text == "":
        return None
    if wants_text(tp):
        return text
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or "cannot be read"
        raise ConfigError(f"not a YAML value ({problem}): {text!r}", path) from None


def wants_text(tp: Any) -> bool:
    """Whether a value of type ``tp`` is best taken as written: a string, never a number."""
    origin = get_origin(tp)
    if origin is Annotated:
        return wants_text(get_args(tp)[0])
    if origin in (Union, types.UnionType):
        arms = [arm for arm in get_args(tp) if arm is not type(None)]
        return len(arms) == 1 and wants_text(arms[0])
    return tp is str


def allows_none(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType) and type(None) in get_args(tp)


def open_field(cls: type) -> str | None:
    """The field an open section keeps its free keys in, or None for a closed section."""
    return getattr(cls, "OPEN_FIELD", None)


def misspelt(key: str, known: Mapping[str, Any]) -> bool:
    return bool(difflib.get_close_matches(key, list(known), n=1, cutoff=0.8))


def section_of(tp: Any) -> Any:
    """``tp`` without ``Annotated``."""
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    return tp


def unknown_key(key: object, known: Sequence[str], path: Sequence[str]) -> ConfigError:
    close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(known)}"
    return ConfigError(f"unknown key; {hint}", (*path, str(key)))


_HINTS: dict[type, dict[str, Any]] = {}


def type_hints(cls: type) -> dict[str, Any]:
    """The settings fields of ``cls`` and their types, in order."""
    hints = _HINTS.get(cls)
    if hints is None:
        every = get_type_hints(cls, include_extras=True)
        hints = _HINTS[cls] = {f.name: every[f.name] for f in dataclasses.fields(cls) if f.init}
    return hints


# -- limits --------------------------------------------------------------------------------


def limits(metadata: Sequence[object]) -> Iterator[object]:
    """The rules in ``Annotated`` metadata, with annotated_types' groups (``Interval``) opened."""
    for rule in metadata:
        if isinstance(rule, annotated_types.GroupedMetadata):
            yield from rule
        else:
            yield rule


def _broken(rule: object, value: Any) -> str | None:
    """Why ``value`` breaks ``rule``, or None."""
    if isinstance(rule, Check):
        return None if rule.test(value) else f"expected {rule.expected}, got {shown(value)}"
    text = limit_text(rule)
    ok = (
        (isinstance(rule, annotated_types.Gt) and value > rule.gt)
        or (isinstance(rule, annotated_types.Ge) and value >= rule.ge)
        or (isinstance(rule, annotated_types.Lt) and value < rule.lt)
        or (isinstance(rule, annotated_types.Le) and value <= rule.le)
    )
    return None if ok else f"must be {text}, got {shown(value)}"


def limit_text(rule: object) -> str:
    for kind, op, attr in (
        (annotated_types.Gt, ">", "gt"),
        (annotated_types.Ge, ">=", "ge"),
        (annotated_types.Lt, "<", "lt"),
        (annotated_types.Le, "<=", "le"),
    ):
        if isinstance(rule, kind):
            return f"{op} {shown(getattr(rule, attr))}"
    if isinstance(rule, Check):
        return ""
    raise TypeError(f"settings limit {rule!r} is not supported")


# -- words ---------------------------------------------------------------------------------

_NOUNS = {bool: "boolean", int: "integer", float: "number", str: "string"}


def describe(tp: Any, article: bool = False) -> str:
    """What a value of type ``tp`` is, in words: ``number > 0``, ``list of strings``."""
    text = _describe(tp)
    if not article or text.startswith(("one of", "'")):
        return text
    return ("an " if text[0] in "aeiou" else "a ") + text


def _describe(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Annotated:
        base, *metadata = get_args(tp)
        rules = [text for text in (limit_text(rule) for rule in limits(metadata)) if text]
        return " ".join([_describe(base), ", ".join(rules)]).strip()
    if origin in (Union, types.UnionType):
        arms = [_describe(arm) for arm in get_args(tp) if arm is not type(None)]
        if allows_none(tp):
            arms.append("null")
        return ", ".join(arms[:-1]) + " or " + arms[-1]
    if origin is Literal:
        choices = [shown(choice) for choice in get_args(tp)]
        return choices[0] if len(choices) == 1 else "one of " + ", ".join(choices)
    if origin is list:
        return f"list of {_plural(_describe(get_args(tp)[0]))}"
    if origin is dict:
        return f"mapping of string to {_describe(get_args(tp)[1])}"
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return "section"
    return _NOUNS.get(tp, getattr(tp, "__name__", str(tp)))


def _plural(noun: str) -> str:
    head, _, rest = noun.partition(" ")
    return f"{head}s {rest}".strip()


def shown(value: object) -> str:
    """A value as the YAML user wrote it: ``true``, ``null``, ``'text'``, ``4``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(str(value)) if isinstance(value, str) else str(value)
