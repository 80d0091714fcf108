"""Running the gateway under uvicorn, with or without embedded engines.

Rules:
- The listening socket is bound before anything starts (engines, store, loops): a port in use
  is one line that says what to do, and ``listening`` is logged only once the port is ours.
- The first SIGINT or SIGTERM starts a graceful stop: requests in flight get
  ``listen.shutdown_grace_s``, every later step is bounded (``runtime.STOP_STEP_S``), and a
  watchdog ends the process ``FORCE_AFTER_S`` past the grace period whatever still runs.
- A signal at any moment of the start stops it, with nothing left running: from the command's
  first line (``cli.main``, also where SIGINT was inherited ignored), through the start
  (``StartSignals``), to the server's own handlers.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import math
import os
import signal
import socket
import ssl
import threading
from collections.abc import Callable, Generator
from types import FrameType

import uvicorn

from priority_gateway import log
from priority_gateway.config import ConfigError, ListenConfig, Raw, load_config
from priority_gateway.config.check import warnings
from priority_gateway.config.env import PREFIX
from priority_gateway.config.limits import ClientLimits
from priority_gateway.embedded import EmbeddedEngines
from priority_gateway.http.app import GatewayApp
from priority_gateway.http.connection import fit_descriptors, protocol_class
from priority_gateway.http.tracing import from_environment
from priority_gateway.keys.admin import with_admin_key
from priority_gateway.runtime import Gateway

# Pools from the environment make a configuration of their own, without a file.
POOLS_OVERRIDE = PREFIX + "POOLS__"
FORCE_AFTER_S = 30.0
"""How long past ``listen.shutdown_grace_s`` a stop may take before the watchdog ends the process."""


class ListenError(Exception):
    """The listening socket cannot be had (the port is taken, the address is not this host's)."""


class StopWatchdog:
    """Ends the process if a stop asked for by a signal has not finished in time."""

    def __init__(self, after_s: float) -> None:
        self.after_s = after_s
        self._timer: threading.Timer | None = None

    def arm(self) -> None:
        if self._timer is None:
            self._timer = threading.Timer(self.after_s, self._fire)
            self._timer.daemon = True
            self._timer.start()

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _fire(self) -> None:
        log.error("shutdown_forced", after_s=self.after_s, why="the graceful stop did not finish in time")
        os._exit(1)


class GatewayServer(uvicorn.Server):
    """uvicorn's server, with the stop watchdog armed by the first signal, and the signals that came
    after the start handed over but before uvicorn's own handlers took them."""

    def __init__(self, config: uvicorn.Config, watchdog: StopWatchdog, signals: StartSignals) -> None:
        super().__init__(config)
        self.watchdog = watchdog
        self.signals = signals

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        with super().capture_signals():
            for sig in self.signals.take_over():
                self.handle_exit(sig, None)
            yield

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.should_exit:
            log.info("stopping", signal=signal.Signals(sig).name, grace_s=self.config.timeout_graceful_shutdown)
        self.watchdog.arm()
        super().handle_exit(sig, frame)


def bind(listen: ListenConfig) -> socket.socket:
    """The listening socket for ``listen``, bound and listening, or ``ListenError`` saying what to do."""
    address = f"{listen.host}:{listen.port}"
    try:
        infos = socket.getaddrinfo(listen.host, listen.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ListenError(f"cannot listen on {address}: {exc.strerror}; set listen.host (--host)") from None
    family, kind, proto, _, sockaddr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(4096)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ListenError(
                f"{address} is already in use (another gateway, `make run` twice, or another program): "
                f"stop it, or serve on another port with --port (listen.port)"
            ) from None
        if exc.errno == errno.EACCES:
            raise ListenError(f"no permission to listen on {address}: use a port above 1023 (--port)") from None
        raise ListenError(f"cannot listen on {address}: {exc.strerror}; check listen.host and listen.port") from None
    sock.set_inheritable(False)
    return sock


def uvicorn_config(app: GatewayApp, listen: ListenConfig, limits: ClientLimits) -> uvicorn.Config:
    # log_config=None: uvicorn's own lines go through the gateway's logger (``log.setup``), one format.
    return uvicorn.Config(
        app,
        host=listen.host,
        port=listen.port,
        ssl_certfile=listen.ssl_certfile,
        ssl_keyfile=listen.ssl_keyfile,
        loop="uvloop",
        http=protocol_class(limits),
        lifespan="on",
        access_log=False,
        proxy_headers=False,  # forwarded headers are trusted only from ``limits.trusted_proxies`` (connection.py)
        server_header=False,
        date_header=False,
        log_level="warning",
        log_config=None,
        timeout_graceful_shutdown=math.ceil(listen.shutdown_grace_s),
        backlog=4096,
        timeout_keep_alive=math.ceil(limits.keepalive_timeout_s),  # uvicorn counts whole seconds
    )


def _try_line(host: str, port: int, model: str) -> str:
    body = f'{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}], "max_tokens": 16}}'
    return (
        f"\nTry it:\n  curl -s http://{host}:{port}/v1/chat/completions "
        f"-H 'Content-Type: application/json' -H 'X-Priority: interactive' -d '{body}'\n"
    )


async def serve(config_path: str | None, host: str | None, port: str | None, log_level: str | None) -> None:
    flags = {
        "listen.host": option(host, "--host"),
        "listen.port": option(port, "--port"),
        "log_level": option(log_level, "--log-level"),
    }
    embedded: EmbeddedEngines | None = None
    sock: socket.socket | None = None
    watchdog: StopWatchdog | None = None
    signals = StartSignals(lambda: watchdog)
    log.setup()  # what reading the configuration says (a key moved) is logged as everything else is
    try:
        if config_path is None and not any(name.startswith(POOLS_OVERRIDE) for name in os.environ):
            embedded = EmbeddedEngines()
            config = load_config(base=embedded.settings(), flags=flags)
        else:
            config = load_config(config_path, flags=flags)
        log.setup(config.log_level)
        listen = config.listen
        watchdog = StopWatchdog(listen.shutdown_grace_s + FORCE_AFTER_S)
        check_certificate(listen)
        sock = bind(listen)
        if embedded is not None:
            embedded.launch()
            await embedded.wait_ready()
        for warning in warnings(config):  # what gateway config check says too
            log.warning(warning.event, **warning.fields)
        config = with_admin_key(config)
        tracing = from_environment()
        gateway = Gateway(config)
        if tracing is not None:
            gateway.tracing = tracing
            gateway.on_stop.append(tracing.shutdown)
            log.info("tracing_on", exporters=",".join(tracing.exporters))
        if embedded is not None:
            # uvicorn re-raises SIGTERM after its graceful shutdown, so a ``finally`` would not run:
            # stop the engines in the lifespan shutdown instead.
            gateway.on_stop.append(embedded.stop)
        limits = fit_descriptors(config.limits)
        server = GatewayServer(uvicorn_config(GatewayApp(gateway), listen, limits), watchdog, signals)
        # Everything built so far lives as long as the process: out of the collector's sight, a full
        # collection walks only what came after (a millisecond, not the 50 ms pause at the p99).
        gc.collect()
        gc.freeze()
        log.info("listening", url=f"{listen.scheme}://{listen.host}:{listen.port}", embedded=embedded is not None)
        if embedded is not None:
            print(_try_line(listen.host, listen.port, embedded.model), flush=True)
        signals.hand_over()
        if signals.requested:
            return  # a signal after the last await of the start: its cancellation would land in uvicorn's
        await server.serve(sockets=[sock])
    finally:
        signals.restore()
        if embedded is not None:
            embedded.stop()
        if sock is not None:
            sock.close()
        if watchdog is not None:
            watchdog.disarm()


class StartSignals:
    """SIGINT and SIGTERM from the start to uvicorn's handlers, in three phases: while the gateway
    starts, a signal cancels the start (engines stopped) under the watchdog; once the start is
    handed over, a signal waits for the server, which takes it as its own when its handlers are in
    (a cancellation then would land in uvicorn's startup); after the server ran, a signal it passes
    back goes where it would have gone without the gateway (the handlers from before)."""

    def __init__(self, watchdog: Callable[[], StopWatchdog | None]) -> None:
        self.requested = False
        self._phase = "start"
        self._waiting: list[int] = []
        self._watchdog = watchdog
        self._loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)}

    def hand_over(self) -> None:
        """From now on a signal waits for the server (``take_over``) instead of cancelling the start."""
        self._phase = "handed_over"

    def take_over(self) -> list[int]:
        """The signals that came since ``hand_over``, for the server whose handlers are now in."""
        self._phase = "server"
        waiting, self._waiting = self._waiting, []
        return waiting

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self._phase == "server":  # passed back by uvicorn after it stopped: as if we were not here
            self.restore()
            signal.raise_signal(signum)
            return
        self.requested = True
        dog = self._watchdog()
        if dog is not None:
            dog.arm()
        if self._phase == "handed_over":
            self._waiting.append(signum)
        else:
            self._loop.call_soon_threadsafe(self._task.cancel)

    def restore(self) -> None:
        """The handlers from before, for uvicorn to take over (it gives them back when it ends)."""
        for sig, old in self._previous.items():
            signal.signal(sig, old)


def check_certificate(listen: ListenConfig) -> None:
    """Refuse, in one line and before anything listens, a certificate or key uvicorn could not load."""
    if listen.ssl_certfile is None:
        return
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(listen.ssl_certfile, listen.ssl_keyfile)
    except OSError as exc:  # ssl.SSLError is one too
        reason = getattr(exc, "reason", None) or exc.strerror or str(exc)
        raise ConfigError(f"cannot load the certificate and key: {reason}", ["listen", "ssl_certfile"]) from None


def option(value: str | None, name: str) -> Raw | None:
    """A command-line option as a configuration override that names the option in errors."""
    return None if value is None else Raw(value, name)
