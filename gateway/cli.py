"""``gateway``: serve, simulate, benchmark and manage keys."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Callable, Sequence

from gateway import log


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gateway", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway (no --config: embedded simulated engines)")
    serve.add_argument("--config", help="YAML config file (GATEWAY_* environment variables override it)")
    serve.add_argument("--host", help="listen address (default from config, else 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (default from config, else 8080)")
    serve.add_argument("--log-level", default=None, help="debug, info, warning, error")
    serve.set_defaults(func=_serve)

    sim = sub.add_parser("sim", help="experiments on simulated engines in virtual time")
    from gateway.simulate.cli import add_arguments as add_sim_arguments

    add_sim_arguments(sim)
    sim.set_defaults(func=_sim)

    bench = sub.add_parser("bench", help="load-test an OpenAI-compatible endpoint and write a report")
    from gateway.bench.cli import add_arguments as add_bench_arguments

    add_bench_arguments(bench)
    bench.set_defaults(func=_bench)

    keys = sub.add_parser("keys", help="create, list and revoke API keys in the configured store")
    from gateway.keys.cli import add_arguments as add_keys_arguments

    add_keys_arguments(keys)
    keys.set_defaults(func=_keys)

    args, rest = parser.parse_known_args(argv)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return int(args.func(args) or 0)


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _serve(args: argparse.Namespace) -> int:
    from gateway.serve import serve

    with contextlib.suppress(KeyboardInterrupt), asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        runner.run(serve(args.config, args.host, args.port, args.log_level))
    return 0


def _sim(args: argparse.Namespace) -> int:
    from gateway.simulate.cli import main as sim_main

    return sim_main(args)


def _keys(args: argparse.Namespace) -> int:
    from gateway.keys.cli import main as keys_main

    return keys_main(args)


def _bench(args: argparse.Namespace) -> int:
    from gateway.bench.cli import main as bench_main

    return bench_main(args)


if __name__ == "__main__":
    log.setup()
    sys.exit(main())
