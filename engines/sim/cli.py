"""``python -m engines.sim``: one simulated vLLM engine behind HTTP."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

import uvicorn

from engines.sim.core import FCFS, PRIORITY, EngineCore
from engines.sim.kv_events import ZmqPublisher
from engines.sim.profile import available_profiles, load_profile
from engines.sim.realtime import RealtimeDriver
from engines.sim.server import SimServer

DEFAULT_PROFILE = "default"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engines.sim", description="Simulated vLLM engine (OpenAI API).")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="sim-model", help="served model name")
    known = ", ".join(available_profiles())
    p.add_argument("--profile", default=DEFAULT_PROFILE, help=f"one of {known}, or a YAML file")
    p.add_argument("--token-delay-ms", type=float, default=None, help="every engine step takes this long")
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--num-blocks", type=int, default=None)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--scheduling-policy", choices=(FCFS, PRIORITY), default=FCFS)
    p.add_argument(
        "--kv-events-endpoint",
        default=None,
        help="ZMQ endpoint for KV cache events: tcp://*:PORT or ipc:// binds, tcp://HOST:PORT connects",
    )
    p.add_argument("--kv-events-topic", default="")
    p.add_argument("--enable-prompt-tokens-details", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-level", default="warning")
    p.add_argument("--ssl-keyfile", default=None, help="serve HTTPS with this key (as vllm serve)")
    p.add_argument("--ssl-certfile", default=None, help="serve HTTPS with this certificate (as vllm serve)")
    return p


def build_server(args: argparse.Namespace) -> SimServer:
    profile = load_profile(args.profile)
    if args.token_delay_ms is not None:
        profile = profile.with_constant_step(args.token_delay_ms)
    core = EngineCore(
        profile,
        model=args.model,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
        num_blocks=args.num_blocks,
        max_model_len=args.max_model_len,
        enable_prefix_caching=args.enable_prefix_caching,
        scheduling_policy=args.scheduling_policy,
        seed=args.seed,
        kv_events=args.kv_events_endpoint is not None,
    )
    publisher = ZmqPublisher(args.kv_events_endpoint, args.kv_events_topic) if args.kv_events_endpoint else None
    driver = RealtimeDriver(core, publish=publisher.publish if publisher else None)
    return SimServer(
        driver,
        seed=args.seed,
        prompt_tokens_details=args.enable_prompt_tokens_details,
        on_shutdown=publisher.close if publisher else None,
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        server = build_server(args)
    except ValueError as exc:
        sys.exit(f"error: {exc}")
    core = server.core
    log = {
        "ts": round(time.time(), 3),
        "event": "engine_start",
        "host": args.host,
        "port": args.port,
        "model": core.model,
        "profile": core.profile.name,
        "block_size": core.block_size,
        "num_blocks": core.profile.num_blocks,
        "max_num_seqs": core.max_num_seqs,
        "max_num_batched_tokens": core.max_num_batched_tokens,
        "max_model_len": core.max_model_len,
        "scheduling_policy": core.scheduling_policy,
        "kv_events_endpoint": args.kv_events_endpoint,
    }
    print(json.dumps(log), flush=True)
    uvicorn.run(
        server,
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level=args.log_level,
        lifespan="on",
        ssl_keyfile=args.ssl_keyfile,
        ssl_certfile=args.ssl_certfile,
    )
