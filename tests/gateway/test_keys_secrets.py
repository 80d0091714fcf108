import pytest

from priority_gateway.config import KeysConfig
from priority_gateway.errors import ApiError
from priority_gateway.keys import KeyAuthenticator, KeySpecError, hash_secret, key_id_of, new_key
from priority_gateway.store import MemoryStore, StoreUnavailable


def test_a_secret_carries_its_key_id_and_only_its_hash_is_kept():
    key, secret = new_key("ci", ["batch", "interactive"], rpm=10)
    assert key_id_of(secret) == key.id and secret.startswith(f"sk-{key.id}.")
    assert key.secret_hash == hash_secret(secret) and secret not in repr(key)
    assert (key.classes, key.default_class) == (["batch", "interactive"], "batch")
    assert key_id_of("sk-nodot") is None and key_id_of("Bearer x") is None


@pytest.mark.parametrize(
    ("classes", "default", "rpm"),
    [([], None, None), (["gold"], None, None), (["batch"], "interactive", None), (["batch"], None, 0)],
)
def test_bad_key_specs_are_refused(classes, default, rpm):
    with pytest.raises(KeySpecError):
        new_key("x", classes, default, rpm)


class FlakyStore(MemoryStore):
    down = False

    async def get_key(self, key_id):
        if self.down:
            raise StoreUnavailable("down")
        return await super().get_key(key_id)


async def test_known_keys_survive_a_store_outage_and_unknown_ones_get_503():
    store = FlakyStore()
    key, secret = new_key("web", ["interactive"])
    await store.put_key(key)
    auth = KeyAuthenticator(store, KeysConfig(cache_s=0))
    await auth.refresh()
    assert auth.required
    assert (await auth.authenticate(f"Bearer {secret}".encode())).key_id == key.id
    store.down = True
    assert (await auth.authenticate(f"Bearer {secret}".encode())).key_id == key.id
    _, stranger = new_key("other", ["batch"])
    with pytest.raises(ApiError) as unknown:
        await auth.authenticate(f"Bearer {stranger}".encode())
    assert unknown.value.status == 503


async def test_the_internal_credential_works_only_in_its_process():
    auth, other = KeyAuthenticator(MemoryStore()), KeyAuthenticator(MemoryStore())
    principal = await auth.authenticate(auth.internal_authorization("key-1"))
    assert (principal.key_id, principal.default_class, principal.allowed) == ("key-1", "batch", frozenset({"batch"}))
    with pytest.raises(ApiError) as forged:
        await auth.authenticate(other.internal_authorization("key-1"))
    assert forged.value.status == 401


class DownStore(MemoryStore):
    async def active_key_count(self):
        raise StoreUnavailable("down")


async def test_keys_are_required_until_the_store_says_there_are_none():
    auth = KeyAuthenticator(DownStore())
    await auth.refresh()
    assert auth.required
    empty = KeyAuthenticator(MemoryStore())
    await empty.refresh()
    assert not empty.required
    assert KeyAuthenticator(DownStore(), KeysConfig(required=False)).required is False
