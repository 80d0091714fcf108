import pytest

from tests.support.procs import Proc


@pytest.fixture(scope="module")
def procs(tmp_path_factory):
    """Processes started by a test module, all stopped when the module ends."""
    started: list[Proc] = []
    yield started
    for proc in reversed(started):
        proc.stop()
