"""``docs/configuration.md``, generated from the settings classes: every key, its type, default and meaning.

Rules:
- Meanings are the attribute docstrings of the settings classes, read from their source; a
  section's description is its class docstring (and, for a section that is one field among
  alike ones, such as ``classes.batch``, that field's docstring first).
- Defaults are the values a fresh ``Config()`` holds, so the page says what the code does.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import re
import sys
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, get_args, get_origin

from priority_gateway.config.env import PREFIX, section_type
from priority_gateway.config.schema import describe, dotted, open_field, shown, type_hints
from priority_gateway.config.sections import Config

INTRO = """\
# Configuration reference

<!-- Generated from priority_gateway/config/sections.py and priority_gateway/batch/settings.py by
`gateway config reference > docs/configuration.md`; tests/gateway/config/test_reference.py
fails when this page and the code disagree. Edit the docstrings there, not this page. -->

`gateway serve --config gateway.yaml` reads one YAML file. Every key has a default except
`pools`; a minimal file names the engines:

```yaml
pools:
  interactive:
    engines: ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
  batch:
    discovery: dns://vllm-batch.default.svc.cluster.local:8000
    scheduling_policy: priority
```

Where a value comes from, each over the one before: the defaults below, the file,
environment variables, command-line options (`--host`, `--port`, `--log-level`).
`gateway config check --config gateway.yaml` checks a file (and the environment) without
starting anything.

**Environment variables** override one key each: `{prefix}` followed by the key's path in
capitals, with `__` between levels: `{prefix}STORE=redis://redis:6379/0`,
`{prefix}LISTEN__PORT=9000`, `{prefix}POOLS__BATCH__ENGINES='["http://10.0.0.3:8000"]'`,
`{prefix}KEYS__ADMIN=...`. Values are taken as written for string keys and read as YAML
otherwise; an empty value means the default. The namespace starts with two underscores so that
nothing else writes into it: Docker Compose files and shells say `GATEWAY_PORT` or
`GATEWAY_ADMIN_KEY` for their own purposes, and Kubernetes gives every pod `GATEWAY_PORT`,
`GATEWAY_SERVICE_HOST` and more for a Service named `gateway`; the gateway reads none of them.
A `{prefix}*` variable that names no key is an error that names the variable. (The
single-underscore overrides of earlier versions, such as `GATEWAY_STORE`, are not read any more;
`gateway serve` logs a warning naming any it finds.)

**Errors**: an unknown key, a value of the wrong type or out of range stops `gateway serve`
(and every other command that reads the file) with one line naming the key and exit status 2,
for example `gateway serve: gateway.yaml: admission.enabld: unknown key; did you mean 'enabled'?`.
`null` (or a key with no value) means the key's default, or no value where the type says `null`.
"""


@dataclass(frozen=True, slots=True)
class Row:
    key: str
    type: str
    default: str
    meaning: str


@dataclass(frozen=True, slots=True)
class Section:
    path: tuple[str, ...]
    description: str
    rows: list[Row]


def render() -> str:
    parts = [INTRO.format(prefix=PREFIX)]
    for section in sections(Config, Config(), ()):
        title = f"`{dotted(section.path)}`" if section.path else "Top level"
        parts.append(f"\n## {title}\n\n{section.description}\n")
        if section.rows:
            parts.append("\n| Key | Type | Default | Meaning |\n| --- | --- | --- | --- |\n")
            parts.extend(f"| `{r.key}` | {r.type} | {r.default} | {r.meaning} |\n" for r in section.rows)
    return "".join(parts)


def sections(cls: type, instance: Any, path: Sequence[str], lead: str = "") -> Iterator[Section]:
    """``cls``'s own keys as one section, then its sections, depth first in field order."""
    docs = attribute_docs(cls)
    rows: list[Row] = []
    nested: list[tuple[type, Any, tuple[str, ...], str]] = []
    for name, tp in type_hints(cls).items():
        inner = section_type(tp)
        if dataclasses.is_dataclass(inner) and isinstance(inner, type):
            nested.append((inner, getattr(instance, name), (*path, name), docs.get(name, "")))
        elif get_origin(inner) is dict and dataclasses.is_dataclass(get_args(inner)[1]):
            item = get_args(inner)[1]
            # An open section's free keys sit beside its fields, not under the field's name.
            where = (*path, "<name>") if name == open_field(cls) else (*path, name, "<name>")
            nested.append((item, item(), where, docs.get(name, "")))
        else:
            meaning = docs.get(name)
            if not meaning:
                raise ValueError(f"{cls.__name__}.{name} has no docstring: say what the setting means")
            rows.append(
                Row(
                    dotted((*path, name)),
                    _cell(_ticks(describe(tp))),
                    _default(getattr(instance, name)),
                    _cell(meaning),
                )
            )
    description = " ".join(part for part in (lead, class_doc(cls)) if part)
    yield Section(tuple(path), description, rows)
    for item_cls, item, item_path, item_lead in nested:
        yield from sections(item_cls, item, item_path, item_lead)


def class_doc(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    if not doc or doc.startswith(cls.__name__ + "("):
        raise ValueError(f"{cls.__name__} has no docstring: say what the section is for")
    return _markdown(doc)


@functools.cache
def attribute_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of ``cls``, as written in its source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body if isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = _markdown(inspect.cleandoc(after.value.value))
    return docs


def _markdown(doc: str) -> str:
    return " ".join(doc.replace("``", "`").split())


def _ticks(text: str) -> str:
    return re.sub(r"'([^']*)'", r"`\1`", text)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _default(value: object) -> str:
    if isinstance(value, list | dict) and not value:
        return "`[]`" if isinstance(value, list) else "`{}`"
    return f"`{value}`" if isinstance(value, str) else f"`{shown(value)}`"


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
