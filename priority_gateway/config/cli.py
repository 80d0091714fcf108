"""``gateway config reference|check``: the configuration's reference page, and a file checked without serving."""

from __future__ import annotations

import argparse
import sys

from priority_gateway.config.load import load_config
from priority_gateway.config.reference import render


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="config_command", required=True)
    sub.add_parser("reference", help="print every key with its type, default and meaning (docs/configuration.md)")
    check = sub.add_parser("check", help="check a config file and the GATEWAY__* environment as gateway serve would")
    check.add_argument("--config", help="YAML config file (without it: the environment alone)")


def main(args: argparse.Namespace) -> int:
    if args.config_command == "reference":
        sys.stdout.write(render())
        return 0
    config = load_config(args.config)
    pools = ", ".join(f"{name} ({len(p.engines) or p.discovery})" for name, p in config.pools.items())
    print(f"{args.config or 'environment'}: ok; pools: {pools}")
    return 0
