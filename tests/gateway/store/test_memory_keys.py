from priority_gateway.store import MemoryStore
from priority_gateway.store.records import ApiKey


async def test_keys_file_is_shared_between_stores(tmp_path):
    path = tmp_path / "keys.json"
    writer, reader = MemoryStore(path), MemoryStore(path)
    await writer.put_key(ApiKey("gk1", "ci", "h", ["batch"], "batch", 1))
    assert [k.id for k in await reader.list_keys()] == ["gk1"]
    await reader.revoke_key("gk1", 5)
    assert (await writer.get_key("gk1")).revoked_at == 5
    assert path.stat().st_mode & 0o777 == 0o600
