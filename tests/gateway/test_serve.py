"""``gateway serve`` starts only on a port of its own and always stops, within a bound, on a signal.

Real processes: the gateway, simulated engines, and an engine that accepts connections and never
answers, so that a health probe is in flight whenever the signal comes.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import uvicorn
import yaml

from priority_gateway.serve import GatewayServer, StartSignals, StopWatchdog
from tests.support.coverage import untraced_env
from tests.support.examples import examples
from tests.support.procs import Proc, free_port, start_engine

# Starts of a gateway that must each end the same way (the ``ci`` profile: a quarter of them).
RUNS = examples(20)
# What a stop may take here: every step of it is bounded (runtime.STOP_STEP_S), and nothing is in flight.
STOP_BOUND_S = 20.0


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}


# Starts Python with SIGINT as argv[1] says (exec keeps a default or ignored disposition): a
# gateway started from a terminal, or with SIGINT ignored as a script's `cmd &` starts it, whatever
# the disposition of the process running the tests.
SIGINT_AS = (
    "import os, signal, sys; signal.signal(signal.SIGINT, getattr(signal, sys.argv[1]));"
    " os.execv(sys.executable, [sys.executable, *sys.argv[2:]])"
)
# ``python -m priority_gateway`` from its first line, once Python's own start is over: it first leaves a file
# saying so. Before that line a Ctrl-C lands in the interpreter (site, the module's lookup, and under the
# tests' coverage its start-up hook, whose bare ``except`` swallows a KeyboardInterrupt and lets the start
# go on), not in the gateway.
GATEWAY_MAIN = (
    "import os, priority_gateway; path = os.path.join(os.path.dirname(priority_gateway.__file__), '__main__.py');"
    " code = compile(open(path).read(), path, 'exec'); open(os.environ['TEST_GATEWAY_STARTED'], 'w').close();"
    " exec(code, {'__name__': '__main__', '__file__': path})"
)


def gateway(tmp_path, name: str, *args: str, sigint: str = "SIG_DFL", traced: bool = True) -> Proc:
    """``traced=False``: not measured by coverage, whose tracer runs Python code of its own on entering each
    new file, where a Ctrl-C lands before the file's first line."""
    port = free_port()
    serve = ["-c", GATEWAY_MAIN, "serve", "--port", str(port), *args]
    cmd = [sys.executable, "-c", SIGINT_AS, sigint, *serve]
    proc = Proc(cmd, f"http://127.0.0.1:{port}", tmp_path / f"{name}.log")
    env = clean_env() if traced else {k: v for k, v in untraced_env().items() if not k.startswith("GATEWAY_")}
    # The mark, inherited by every process the gateway starts, finds them after it is gone.
    proc.env = {
        **env,
        "GATEWAY_TEST_MARK": f"{name}-{uuid.uuid4().hex}",
        "TEST_GATEWAY_STARTED": str(tmp_path / f"{name}.started"),
    }
    return proc.start()


def wait_until_the_gateway_runs(proc: Proc, within_s: float) -> None:
    """Until Python's start is over and the gateway's own first line comes next (``GATEWAY_MAIN``)."""
    started = Path(proc.env["TEST_GATEWAY_STARTED"])
    deadline = time.monotonic() + within_s
    while not started.exists():
        assert time.monotonic() < deadline, f"the gateway's Python did not start within {within_s} s\n{proc.log()}"
        time.sleep(0.002)


def wait_until_sigint_is_taken(pid: int, within_s: float) -> None:
    """Until the gateway (the launcher has exec'd it) catches SIGINT (``SigCgt`` in ``/proc/<pid>/status``)."""
    deadline = time.monotonic() + within_s
    bit = 1 << (signal.SIGINT - 1)
    while time.monotonic() < deadline:
        status = Path(f"/proc/{pid}/status").read_text()
        caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
        if caught & bit:
            return
        time.sleep(0.005)
    raise AssertionError(f"the gateway did not take SIGINT within {within_s} s")


def marked(proc: Proc) -> list[int]:
    """Processes still running that carry ``proc``'s mark in their environment."""
    mark = f"GATEWAY_TEST_MARK={proc.env['GATEWAY_TEST_MARK']}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if mark in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def exit_code(proc: Proc, within_s: float) -> int | None:
    assert proc.popen is not None
    try:
        return proc.popen.wait(timeout=within_s)
    except subprocess.TimeoutExpired:
        return None


def stop_within(proc: Proc, sig: int, within_s: float) -> int | None:
    """Signal the process group, as a terminal's Ctrl-C does; its exit code, or None if still running."""
    assert proc.popen is not None
    os.killpg(proc.popen.pid, sig)
    code = exit_code(proc, within_s)
    if code is None:
        proc.kill()
    return code


class BlackHole:
    """A TCP server that accepts and never answers: every request to it stays in flight."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def test_a_port_in_use_is_one_line_that_says_what_to_do_every_time(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        for run in range(RUNS):
            proc = gateway(tmp_path, f"taken-{run}", "--port", str(port))  # the last --port wins
            code = exit_code(proc, STOP_BOUND_S)
            if code is None:
                proc.kill()
            log = proc.log()
            assert code == 1, f"run {run}: {code}\n{log}"
            lines = log.strip().splitlines()
            assert len(lines) == 1, log
            assert "event=listen_failed" in lines[0] and f"127.0.0.1:{port} is already in use" in lines[0]
            assert "--port" in lines[0] and "Errno" not in log and "listening" not in log
    finally:
        taken.close()


def test_a_signal_stops_the_gateway_with_probes_in_flight_every_time(tmp_path):
    engine = start_engine(tmp_path).wait_ready()
    hole = BlackHole()
    config = tmp_path / "gateway.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "store": "memory",
                "pools": {"interactive": {"engines": [engine.url, hole.url]}},
                # Probes back to back: one to the black hole always in flight, one to the engine often.
                "health": {"interval_s": 0.01, "timeout_s": 60},
                "scrape": {"interval_s": 0.05},
            }
        )
    )
    try:
        for run in range(RUNS):
            proc = gateway(tmp_path, f"probes-{run}", "--config", str(config))
            proc.wait_ready("/ready", timeout=60)
            time.sleep(0.01 * run)  # a different moment of the probe cycle each run
            sig = signal.SIGINT if run % 2 == 0 else signal.SIGTERM
            code = stop_within(proc, sig, STOP_BOUND_S)
            assert code is not None, f"run {run}: still running {STOP_BOUND_S} s after {sig.name}\n{proc.log()}"
            assert "event=gateway_stopped" in proc.log(), proc.log()
    finally:
        hole.close()
        engine.stop()


# From 0.75 s: on a quiet machine the gateway is loading its modules by then. The moment counts from the
# start but never comes before the gateway's first line (``GATEWAY_MAIN``; untraced, so that coverage's code
# does not run in between): on a busy machine Python's own start can outlast 0.75 s. Started with SIGINT
# ignored, it also waits for the gateway to take SIGINT: the kernel drops a signal the process ignores, so
# no program could see that Ctrl-C.
@pytest.mark.parametrize(
    ("sigint", "after_s"),
    [("SIG_DFL", 0.75), ("SIG_DFL", 1.5), ("SIG_DFL", 3.0), ("SIG_DFL", 6.0), ("SIG_IGN", 0.75), ("SIG_IGN", 1.5)],
)
def test_ctrl_c_at_any_moment_of_the_embedded_start_stops_it_and_its_engines(tmp_path, sigint, after_s):
    started = time.monotonic()
    proc = gateway(tmp_path, "embedded", sigint=sigint, traced=False)
    assert proc.popen is not None
    wait_until_the_gateway_runs(proc, 30.0)
    if sigint == "SIG_IGN":
        wait_until_sigint_is_taken(proc.popen.pid, 30.0)
    time.sleep(max(0.0, after_s - (time.monotonic() - started)))
    code = stop_within(proc, signal.SIGINT, STOP_BOUND_S)
    assert code is not None, f"still running {STOP_BOUND_S} s after Ctrl-C at {after_s} s\n{proc.log()}"
    assert "Traceback" not in proc.log(), proc.log()
    assert marked(proc) == [], "processes the gateway started are still running"


# Ctrl-C the moment the gateway imports fastapi, from inside the import, then more code of that import.
CTRL_C_WHILE_LOADING = """
import os, signal, sys
from importlib.abc import MetaPathFinder

class CtrlC(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "fastapi":
            return None
        sys.meta_path.remove(self)
        try:
            os.kill(os.getpid(), signal.SIGINT)
            sum(range(1000))
            print("the import went on", flush=True)
        except KeyboardInterrupt:
            print("KeyboardInterrupt inside the import", flush=True)
            raise
        return None

sys.meta_path.insert(0, CtrlC())
from priority_gateway.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_ctrl_c_while_modules_load_is_never_raised_inside_the_code_loading_them():
    # Raised there, a library may handle it as its own error (pydantic-core turns it into a SchemaError:
    # a traceback and exit 1) or lose it (a gateway left running after Ctrl-C). Counted instead, it
    # stops the command once its modules are in.
    cmd = [sys.executable, "-c", CTRL_C_WHILE_LOADING, "serve", "--port", str(free_port())]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=clean_env())
    out = done.stdout + done.stderr
    assert "the import went on" in out, out
    assert done.returncode == 130, out
    assert "Traceback" not in out, out


async def _lifespan_only(scope, receive, send, events: list[str]) -> None:
    assert scope["type"] == "lifespan"
    while True:
        message = await receive()
        events.append(message["type"])
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        else:
            await send({"type": "lifespan.shutdown.complete"})
            return


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
async def test_a_signal_between_the_start_and_uvicorns_handlers_stops_the_server_cleanly(sig):
    """The start is over (handed over) but uvicorn has not put its handlers in: the signal waits for
    the server, which starts and stops cleanly, then goes back to the handler from before (asyncio's
    runner's, here a recorder) once, as it would without the gateway."""
    passed_back: list[int] = []
    before = signal.signal(sig, lambda signum, _frame: passed_back.append(signum))
    events: list[str] = []
    listener = socket.create_server(("127.0.0.1", 0))
    watchdog = StopWatchdog(120.0)
    try:
        signals = StartSignals(lambda: watchdog)
        config = uvicorn.Config(
            lambda scope, receive, send: _lifespan_only(scope, receive, send, events),
            interface="asgi3",
            lifespan="on",
            log_config=None,
        )
        server = GatewayServer(config, watchdog, signals)
        signals.hand_over()
        signal.raise_signal(sig)
        await asyncio.wait_for(server.serve(sockets=[listener]), 30)
    finally:
        watchdog.disarm()
        listener.close()
        signal.signal(sig, before)
    assert server.should_exit
    assert events == ["lifespan.startup", "lifespan.shutdown"]
    assert passed_back == [sig]
