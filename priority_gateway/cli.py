"""gateway: serve, simulate, benchmark and manage keys."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from collections.abc import Callable, Sequence
from types import FrameType
from typing import TYPE_CHECKING, get_args

from priority_gateway import log

if TYPE_CHECKING:
    import asyncio

SERVE_EPILOG = """\
Every configuration key, with its type, default and meaning: docs/configuration.md, or
gateway config reference. Environment variables override single keys:
{prefix}<SECTION>__<KEY>=value, e.g. {prefix}STORE=redis://localhost:6379/0 or
{prefix}POOLS__BATCH__POLICY=least_loaded. Options override both.
"""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's help ends with its default, unless the help already says it (or there is none to
    say: a flag, a required option)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or action.required
            or not action.option_strings
            or default is None
            or default is False
            or default == []
            or default == argparse.SUPPRESS
            or isinstance(action, argparse._HelpAction | argparse._VersionAction)
        ):
            return text
        if isinstance(default, bool):  # --x/--no-x
            default = f"--{action.dest.replace('_', '-')}" if default else f"--no-{action.dest.replace('_', '-')}"
        return f"{text} (default: {default})" if text else f"default: {default}"


class _CtrlCWhileLoading:
    """SIGINT while the modules load, counted instead of raised. A KeyboardInterrupt raised inside
    whatever code is loading lands in a library's own handling: pydantic-core turns it into a
    SchemaError (a traceback, exit 1), and code that catches every exception loses it, leaving a
    gateway running that someone asked to stop. Counted, it stops the command once its modules are
    in (``interruptible``)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, _signum: int, _frame: FrameType | None) -> None:
        self.count += 1


_LOADING = _CtrlCWhileLoading()


def interruptible() -> None:
    """A command's modules are in: Ctrl-C raises KeyboardInterrupt from here on, and one that came while
    they loaded raises now."""
    with contextlib.suppress(ValueError):  # not the main thread: it cannot set handlers, nor needs to
        if signal.getsignal(signal.SIGINT) is _LOADING:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    if _LOADING.count:
        _LOADING.count = 0
        raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    # Ctrl-C stops every command from here on, also one started with SIGINT ignored (a script's
    # `gateway serve &`): uvicorn takes SIGINT once it serves whatever was inherited, so a Ctrl-C
    # ignored while the modules load would leave running a gateway someone asked to stop.
    with contextlib.suppress(ValueError):  # not the main thread: it cannot set handlers, nor needs to
        signal.signal(signal.SIGINT, _LOADING)
    try:
        return _main(argv)
    except KeyboardInterrupt:
        # Ctrl-C before a command has its own handling (while modules load): a stop, not a crash.
        return 130


def _main(argv: Sequence[str] | None) -> int:
    # Imported here, not at the top: a Ctrl-C while they load is then the quiet stop above.
    from priority_gateway.config import Config, ConfigError
    from priority_gateway.config.env import PREFIX
    from priority_gateway.config.sections import LogLevel

    parser = argparse.ArgumentParser(prog="gateway", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    defaults = Config()
    serve = sub.add_parser(
        "serve",
        help="run the gateway (no --config: embedded simulated engines)",
        epilog=SERVE_EPILOG.format(prefix=PREFIX),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument(
        "--config", metavar="FILE", help="YAML config file (default: none, and simulated engines of its own)"
    )
    serve.add_argument("--host", help=f"listen address (default: listen.host, else {defaults.listen.host})")
    serve.add_argument("--port", help=f"listen port (default: listen.port, else {defaults.listen.port})")
    serve.add_argument(
        "--log-level",
        help=f"{', '.join(get_args(LogLevel))} (default: log_level, else {defaults.log_level})",
    )
    serve.set_defaults(func=_serve)

    sim = sub.add_parser("sim", help="experiments on simulated engines in virtual time", formatter_class=HelpFormatter)
    from priority_gateway.simulate.cli import add_arguments as add_sim_arguments

    add_sim_arguments(sim)
    sim.set_defaults(func=_sim)

    bench = sub.add_parser(
        "bench", help="load-test an OpenAI-compatible endpoint and write a report", formatter_class=HelpFormatter
    )
    from priority_gateway.bench.cli import add_arguments as add_bench_arguments

    add_bench_arguments(bench)
    bench.set_defaults(func=_bench)

    keys = sub.add_parser("keys", help="create, list and revoke API keys in the configured store")
    from priority_gateway.keys.cli import add_arguments as add_keys_arguments

    add_keys_arguments(keys)
    keys.set_defaults(func=_keys)

    config = sub.add_parser("config", help="print the configuration reference, or check a config file")
    from priority_gateway.config.cli import add_arguments as add_config_arguments

    add_config_arguments(config)
    config.set_defaults(func=_config)

    args, rest = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return 0 if not rest else 2
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        # One line a person can act on; a traceback would bury it.
        print(f"gateway {args.command}: {exc}", file=sys.stderr)
        return 2


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("priority-gateway")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _serve(args: argparse.Namespace) -> int:
    import asyncio

    from priority_gateway.serve import ListenError, serve

    loop_factory = event_loop_factory()  # imports uvloop: still loading
    interruptible()
    try:
        # A signal before uvicorn runs cancels the start (CancelledError); SIGINT after, KeyboardInterrupt.
        with (
            contextlib.suppress(KeyboardInterrupt, asyncio.CancelledError),
            asyncio.Runner(loop_factory=loop_factory) as runner,
        ):
            runner.run(serve(args.config, args.host, args.port, args.log_level))
    except ListenError as exc:
        log.error("listen_failed", reason=str(exc))
        return 1
    return 0


def _sim(args: argparse.Namespace) -> int:
    from priority_gateway.simulate.cli import main as sim_main

    interruptible()

    return sim_main(args)


def _keys(args: argparse.Namespace) -> int:
    from priority_gateway.keys.cli import main as keys_main

    interruptible()

    return keys_main(args)


def _config(args: argparse.Namespace) -> int:
    from priority_gateway.config.cli import main as config_main

    interruptible()

    return config_main(args)


def _bench(args: argparse.Namespace) -> int:
    from priority_gateway.bench.cli import main as bench_main

    interruptible()

    return bench_main(args)


if __name__ == "__main__":
    log.setup()
    sys.exit(main())
