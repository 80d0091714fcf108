import pytest

from tests.support.procs import Proc
from tests.support.tls import make_certs


@pytest.fixture(scope="module")
def procs(tmp_path_factory):
    """Processes started by a test module, all stopped when the module ends."""
    started: list[Proc] = []
    yield started
    for proc in reversed(started):
        proc.stop()


@pytest.fixture(scope="session")
def certs(tmp_path_factory):
    """A private CA and a server certificate it signed for 127.0.0.1 (``tests.support.tls``)."""
    return make_certs(tmp_path_factory.mktemp("certs"))
