"""The catalog without processes: a monitor stand-in holding engines' /v1/models entries."""

from priority_gateway.config import parse_config
from priority_gateway.models import LISTED_IN_ERROR, Catalog


class Listing:
    def __init__(self, entries):
        self.entries = entries
        self.models_version = 1

    def models(self):
        return self.entries


def catalog(entries, **config):
    pool = {"engines": ["http://e:1"], "models": [e["id"] for e in entries]}
    return Catalog(parse_config({"pools": {"p": pool}, **config}), Listing(entries))


def test_an_adapter_resolves_with_its_base_models_root():
    base = {"id": "tiny", "root": "/models/tiny", "parent": None}
    alias = {"id": "tiny-alias", "root": "/models/tiny", "parent": None}
    sql = {"id": "sql", "root": "/adapters/sql", "parent": "tiny"}
    c = catalog([base, alias, sql])
    assert c.resolve("sql").adapter == "sql"
    assert c.resolve("tiny").adapter is None
    # Two names of one base model share cache; an adapter does not.
    assert c.resolve("tiny").seed == c.resolve("tiny-alias").seed != c.resolve("sql").seed


def test_the_unknown_model_message_is_bounded():
    c = catalog([{"id": f"adapter-{i:03d}", "parent": None} for i in range(500)])
    message = c.unknown_message("nope")
    assert message.count("adapter-") == LISTED_IN_ERROR
    assert "and 480 more" in message
    assert len(message) < 600


def test_aliases_are_known_and_listed():
    c = catalog([{"id": "llama", "parent": None}], models={"aliases": {"chat": "llama"}})
    assert "chat" in c.known()
    assert c.resolve("chat").served == "llama"
    assert {m["id"] for m in c.listing()} == {"llama", "chat"}


def test_the_catalog_is_rebuilt_only_when_the_monitor_says_so():
    listing = Listing([{"id": "a", "parent": None}])
    c = Catalog(parse_config({"pools": {"p": {"engines": ["http://e:1"]}}}), listing)
    assert "a" in c.known()
    listing.entries = [{"id": "b", "parent": None}]
    assert "b" not in c.known()
    listing.models_version += 1
    assert "b" in c.known()


def test_a_name_resolves_anew_once_the_engines_list_it_differently():
    listing = Listing([{"id": "tiny", "root": "/models/tiny", "parent": None}, {"id": "sql", "parent": None}])
    c = Catalog(parse_config({"pools": {"p": {"engines": ["http://e:1"]}}}), listing)
    assert c.resolve("sql").adapter is None and c.resolve("sql") is c.resolve("sql")
    listing.entries = [listing.entries[0], {"id": "sql", "root": "/adapters/sql", "parent": "tiny"}]
    listing.models_version += 1
    assert c.resolve("sql").adapter == "sql"


def test_a_split_alias_still_splits_and_unknown_names_are_not_kept():
    c = catalog(
        [{"id": "a", "parent": None}, {"id": "b", "parent": None}],
        models={"aliases": {"ab": [{"model": "a", "weight": 1}, {"model": "b", "weight": 1}]}},
    )
    assert {c.resolve("ab").served for _ in range(4)} == {"a", "b"}
    for n in range(100):
        c.resolve(f"client-chosen-{n}")
    assert c.resolve("client-chosen-0") is not c.resolve("client-chosen-0")
