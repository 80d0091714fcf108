import os

import pytest

from tests.support.coverage import untraced
from tests.support.examples import load_profile
from tests.support.procs import Proc
from tests.support.tls import make_certs

load_profile()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """A test marked ``untraced`` runs with coverage's tracer off (``tests.support.coverage``)."""
    if item.get_closest_marker("untraced") is None:
        yield
        return
    with untraced():
        yield


@pytest.fixture(scope="module")
def procs():
    """Processes started by a test module, all stopped when the module ends."""
    started: list[Proc] = []
    yield started
    for proc in reversed(started):
        proc.stop()


@pytest.fixture(scope="session")
def certs(tmp_path_factory):
    """A private CA and a server certificate it signed for 127.0.0.1 (``tests.support.tls``)."""
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="session", autouse=True)
def state_home(tmp_path_factory):
    """The default data directory (``store: sqlite``) of every gateway a test starts without one of its
    own is in the session's temporary directory, never in the home directory of whoever runs the tests."""
    path = tmp_path_factory.mktemp("state")
    previous = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(path)
    yield path
    if previous is None:
        del os.environ["XDG_STATE_HOME"]
    else:
        os.environ["XDG_STATE_HOME"] = previous
