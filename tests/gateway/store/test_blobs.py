import pytest

from priority_gateway.store import DirectoryBlobs


async def test_directory_blobs_round_trip_and_leave_no_temporary_files(tmp_path):
    blobs = DirectoryBlobs(tmp_path / "files")
    await blobs.put_blob("file-abc", b"line\n" * 100)
    assert await blobs.get_blob("file-abc") == b"line\n" * 100
    assert await blobs.read_blob("file-abc", 3, 4) == b"e\nli"
    assert await blobs.read_blob("file-abc", 498, 10) == b"e\n"
    assert [p.name for p in (tmp_path / "files").iterdir()] == ["file-abc"]
    await blobs.delete_blob("file-abc")
    await blobs.delete_blob("file-abc")
    assert await blobs.get_blob("file-abc") is None
    assert await blobs.read_blob("file-abc", 0, 1) is None


async def test_directory_blobs_refuse_ids_that_are_paths(tmp_path):
    with pytest.raises(ValueError):
        await DirectoryBlobs(tmp_path).put_blob("../escape", b"x")
