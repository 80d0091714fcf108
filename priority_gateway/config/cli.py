"""gateway config reference|check: the configuration's reference page, and a file checked without serving."""

from __future__ import annotations

import argparse
import os
import sys

from priority_gateway.config.check import summary, warnings
from priority_gateway.config.env import PREFIX
from priority_gateway.config.load import load_config
from priority_gateway.config.reference import render


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="config_command", required=True)
    sub.add_parser("reference", help="print every key with its type, default and meaning (docs/configuration.md)")
    check = sub.add_parser(
        "check",
        help="check a config file and the GATEWAY__* environment as gateway serve would, and print the result",
    )
    check.add_argument(
        "--config", help="YAML config file (default: none, the environment alone; none at all is the embedded default)"
    )


def main(args: argparse.Namespace) -> int:
    if args.config_command == "reference":
        sys.stdout.write(render())
        return 0
    if args.config is None and not any(name.startswith(PREFIX + "POOLS__") for name in os.environ):
        # As gateway serve does: no pools anywhere is the embedded default, with simulated engines.
        from priority_gateway.embedded import EmbeddedEngines

        config = load_config(base=EmbeddedEngines().settings())
        source = "embedded default"
    else:
        config = load_config(args.config)
        source = args.config or "environment"
    pools = ", ".join(f"{name} ({len(p.engines) or p.discovery})" for name, p in config.pools.items())
    print(f"{source}: ok; pools: {pools}")
    for line in summary(config):
        print(f"  {line}")
    for warning in warnings(config):
        print(f"warning: {warning.text}", file=sys.stderr)
    return 0
