"""``gateway``: serve, simulate, benchmark and manage keys."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Callable, Sequence
from typing import get_args

from priority_gateway import log
from priority_gateway.config import Config, ConfigError
from priority_gateway.config.env import PREFIX
from priority_gateway.config.sections import LogLevel

SERVE_EPILOG = f"""\
Every configuration key, with its type, default and meaning: docs/configuration.md, or
`gateway config reference`. Environment variables override single keys:
{PREFIX}<SECTION>__<KEY>=value, e.g. {PREFIX}STORE=redis://localhost:6379/0 or
{PREFIX}POOLS__BATCH__POLICY=least_loaded. Options override both.
"""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gateway", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    defaults = Config()
    serve = sub.add_parser(
        "serve",
        help="run the gateway (no --config: embedded simulated engines)",
        epilog=SERVE_EPILOG,
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

    sim = sub.add_parser("sim", help="experiments on simulated engines in virtual time")
    from priority_gateway.simulate.cli import add_arguments as add_sim_arguments

    add_sim_arguments(sim)
    sim.set_defaults(func=_sim)

    bench = sub.add_parser("bench", help="load-test an OpenAI-compatible endpoint and write a report")
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
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        # One line a person can act on; a traceback would bury it.
        print(f"gateway {args.command}: {exc}", file=sys.stderr)
        return 2


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _serve(args: argparse.Namespace) -> int:
    from priority_gateway.serve import serve

    with contextlib.suppress(KeyboardInterrupt), asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        runner.run(serve(args.config, args.host, args.port, args.log_level))
    return 0


def _sim(args: argparse.Namespace) -> int:
    from priority_gateway.simulate.cli import main as sim_main

    return sim_main(args)


def _keys(args: argparse.Namespace) -> int:
    from priority_gateway.keys.cli import main as keys_main

    return keys_main(args)


def _config(args: argparse.Namespace) -> int:
    from priority_gateway.config.cli import main as config_main

    return config_main(args)


def _bench(args: argparse.Namespace) -> int:
    from priority_gateway.bench.cli import main as bench_main

    return bench_main(args)


if __name__ == "__main__":
    log.setup()
    sys.exit(main())
