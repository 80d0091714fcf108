"""``python -m priority_gateway.engines.sim``: one simulated vLLM engine behind HTTP, spelled as ``vllm serve``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

import uvicorn

from priority_gateway.engines.sim.core import FCFS, PRIORITY, EngineCore
from priority_gateway.engines.sim.cpu_tier import blocks_for_size
from priority_gateway.engines.sim.kv_events import ZmqPublisher
from priority_gateway.engines.sim.models import ServedModels, parse_lora_module, runtime_lora_updating
from priority_gateway.engines.sim.profile import Profile, available_profiles, load_profile
from priority_gateway.engines.sim.protocol import ApiError
from priority_gateway.engines.sim.realtime import RealtimeDriver
from priority_gateway.engines.sim.server import SimServer
from priority_gateway.engines.sim.tracing import RequestTracer

DEFAULT_PROFILE = "default"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m priority_gateway.engines.sim", description="Simulated vLLM engine (OpenAI API)."
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="sim-model", help="the model (its path or name: the root of /v1/models)")
    p.add_argument(
        "--served-model-name", nargs="+", default=None, help="names the model is served under (default: --model)"
    )
    p.add_argument("--enable-lora", action="store_true", help="serve LoRA adapters")
    p.add_argument(
        "--lora-modules",
        nargs="+",
        default=None,
        help='adapters to load at start: name=path or \'{"name": ..., "path": ..., "base_model_name": ...}\'',
    )
    p.add_argument("--max-loras", type=int, default=1, help="adapters in GPU slots at once (a batch's limit)")
    p.add_argument("--max-cpu-loras", type=int, default=None, help="adapters in the CPU cache (default: --max-loras)")
    p.add_argument("--max-lora-rank", type=int, default=16)
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
    add_kv_arguments(p)
    p.add_argument("--enable-prompt-tokens-details", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-level", default="warning")
    p.add_argument(
        "--otlp-traces-endpoint",
        default=None,
        help="send a span per request to this OTLP endpoint, under the caller's traceparent (as vllm serve)",
    )
    p.add_argument("--ssl-keyfile", default=None, help="serve HTTPS with this key (as vllm serve)")
    p.add_argument("--ssl-certfile", default=None, help="serve HTTPS with this certificate (as vllm serve)")
    return p


def add_kv_arguments(p: argparse.ArgumentParser) -> None:
    """The KV cache's CPU tier and its events, under vllm serve's names."""
    p.add_argument(
        "--kv-offloading-size",
        type=float,
        default=None,
        help="GiB of CPU memory for KV blocks offloaded from the GPU (as vllm serve; needs the profile's "
        "kv_bytes_per_token, else use --kv-offloading-blocks)",
    )
    p.add_argument(
        "--kv-offloading-backend",
        choices=("native", "lmcache"),
        default="native",
        help="native: vLLM's own CPU offloading, the one simulated; lmcache is not",
    )
    p.add_argument(
        "--kv-offloading-blocks",
        type=int,
        default=None,
        help="the CPU tier's size in blocks (simulator only; overrides --kv-offloading-size)",
    )
    p.add_argument(
        "--kv-events-endpoint",
        default=None,
        help="ZMQ endpoint for KV cache events: tcp://*:PORT or ipc:// binds, tcp://HOST:PORT connects",
    )
    p.add_argument("--kv-events-topic", default="")
    p.add_argument(
        "--kv-events-replay-endpoint",
        default=None,
        help="ZMQ ROUTER endpoint (tcp://*:PORT) answering requests for missed KV event batches "
        "(vLLM's kv-events-config replay_endpoint)",
    )
    p.add_argument(
        "--kv-events-buffer-steps", type=int, default=10_000, help="batches kept for replay (vLLM's buffer_steps)"
    )


def build_server(args: argparse.Namespace) -> SimServer:
    profile = load_profile(args.profile)
    if args.token_delay_ms is not None:
        profile = profile.with_constant_step(args.token_delay_ms)
    core = EngineCore(
        profile,
        model=(args.served_model_name or [args.model])[0],
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
        num_blocks=args.num_blocks,
        max_model_len=args.max_model_len,
        enable_prefix_caching=args.enable_prefix_caching,
        scheduling_policy=args.scheduling_policy,
        seed=args.seed,
        kv_events=args.kv_events_endpoint is not None,
        enable_lora=args.enable_lora,
        max_loras=args.max_loras,
        max_cpu_loras=args.max_cpu_loras,
        max_lora_rank=args.max_lora_rank,
        kv_offloading_blocks=offloading_blocks(args, profile),
    )
    models = ServedModels(
        args.served_model_name or [args.model],
        args.model,
        core.max_model_len,
        runtime_updating=runtime_lora_updating(),
    )
    load_lora_modules(core, models, args.lora_modules or [])
    publisher = (
        ZmqPublisher(
            args.kv_events_endpoint,
            args.kv_events_topic,
            replay_endpoint=args.kv_events_replay_endpoint,
            buffer_steps=args.kv_events_buffer_steps,
        )
        if args.kv_events_endpoint
        else None
    )
    driver = RealtimeDriver(core, publish=publisher.publish if publisher else None)
    return SimServer(
        driver,
        seed=args.seed,
        prompt_tokens_details=args.enable_prompt_tokens_details,
        on_shutdown=publisher.close if publisher else None,
        models=models,
        tracer=RequestTracer(args.otlp_traces_endpoint) if args.otlp_traces_endpoint else None,
    )


def offloading_blocks(args: argparse.Namespace, profile: Profile) -> int | None:
    """The CPU tier's blocks from ``--kv-offloading-blocks`` or ``--kv-offloading-size`` (``None``: no tier)."""
    if args.kv_offloading_blocks is None and args.kv_offloading_size is None:
        return None
    if args.kv_offloading_backend != "native":
        raise ValueError(f"--kv-offloading-backend {args.kv_offloading_backend} is not simulated; use native")
    if args.kv_offloading_blocks is not None:
        if args.kv_offloading_blocks < 0:
            raise ValueError("--kv-offloading-blocks must not be negative")
        return int(args.kv_offloading_blocks)
    if not profile.kv_bytes_per_token:
        raise ValueError(
            f"profile {profile.name!r} has no kv_bytes_per_token to turn --kv-offloading-size into blocks; "
            "give --kv-offloading-blocks"
        )
    block_size = args.block_size or profile.block_size
    return blocks_for_size(args.kv_offloading_size, profile.kv_bytes_per_token, block_size)


def load_lora_modules(core: EngineCore, models: ServedModels, entries: Sequence[str]) -> None:
    """Register ``--lora-modules`` as vLLM does at start; any failure stops the start."""
    if entries and core.lora_slots is None:
        raise ValueError("--lora-modules needs --enable-lora")
    for entry in entries:
        module = parse_lora_module(entry)
        try:
            models.check_load(module.name, module.path)
            adapter = models.prepare(module.name, module.path, module.base_model_name)
        except ApiError as exc:
            raise ValueError(exc.message) from None
        core.add_lora(adapter)
        models.register(adapter)


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
        "served_model_names": server.models.served_names,
        "lora_adapters": list(server.models.adapters),
        "max_loras": core.max_loras if core.lora_slots is not None else None,
        "profile": core.profile.name,
        "block_size": core.block_size,
        "num_blocks": core.profile.num_blocks,
        "max_num_seqs": core.max_num_seqs,
        "max_num_batched_tokens": core.max_num_batched_tokens,
        "max_model_len": core.max_model_len,
        "scheduling_policy": core.scheduling_policy,
        "kv_events_endpoint": args.kv_events_endpoint,
        "kv_offloading_blocks": core.profile.kv_offloading_blocks,
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
