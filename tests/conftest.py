import os

import pytest

from tests.support.coverage import untraced
from tests.support.examples import load_profile
from tests.support.procs import Proc
from tests.support.tls import make_certs

load_profile()


# The modules that take longest (tens of seconds each, measured with ``--junitxml`` under ``make test``),
# longest first. Run on several workers (``--dist loadfile --no-loadscope-reorder``), they start first, so
# that the many short modules fill in behind them and no worker is left with a long one at the end.
LONGEST_FIRST = (
    "tests/test_readme.py",
    "tests/gateway/simulate/test_cluster.py",
    "tests/gateway/test_keys.py",
    "tests/benchmarks/test_fairness_realtime.py",
    "tests/gateway/http/test_files.py",
    "tests/gateway/bench/test_bench.py",
    "tests/gateway/test_fleet_channel.py",
    "tests/gateway/test_serve.py",
    "tests/gateway/test_ratelimit.py",
    "tests/gateway/config/test_cli.py",
    "tests/test_packaging.py",
    "tests/benchmarks/test_gpu_budgets.py",
    "tests/gateway/test_models.py",
    "tests/gateway/http/test_connection.py",
    "tests/benchmarks/test_fleet_admission_realtime.py",
    "tests/gateway/test_fleet_admission.py",
    "tests/gateway/test_session_holds.py",
    "tests/benchmarks/test_limiter_evidence.py",
)


def pytest_collection_modifyitems(config, items):
    """The modules of ``LONGEST_FIRST`` first, in its order; the rest as collected."""
    root = config.rootpath
    missing = [path for path in LONGEST_FIRST if not (root / path).exists()]
    assert not missing, f"LONGEST_FIRST names modules that do not exist: {missing}"
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.relative_to(root).as_posix(), len(rank)))


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
