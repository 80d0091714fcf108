"""Running the gateway under uvicorn, with or without embedded engines."""

from __future__ import annotations

import os

import uvicorn

from gateway import log
from gateway.config import Config, load_config
from gateway.embedded import EmbeddedEngines
from gateway.http.app import GatewayApp
from gateway.http.connection import fit_descriptors, protocol_class
from gateway.limits import ClientLimits
from gateway.runtime import Gateway


def uvicorn_config(app: GatewayApp, host: str, port: int, limits: ClientLimits) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http=protocol_class(limits),
        lifespan="on",
        access_log=False,
        server_header=False,
        date_header=False,
        log_level="warning",
        backlog=4096,
        timeout_keep_alive=limits.keepalive_timeout_s,
    )


def _try_line(host: str, port: int, model: str) -> str:
    body = f'{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}], "max_tokens": 16}}'
    return (
        f"\nTry it:\n  curl -s http://{host}:{port}/v1/chat/completions "
        f"-H 'Content-Type: application/json' -H 'X-Priority: interactive' -d '{body}'\n"
    )


async def serve(config_path: str | None, host: str | None, port: int | None, log_level: str | None) -> None:
    embedded: EmbeddedEngines | None = None
    try:
        if config_path is None and not any(k.startswith("GATEWAY_POOLS") for k in os.environ):
            log.setup(log_level or "info")
            embedded = EmbeddedEngines()
            embedded.launch()
            await embedded.wait_ready()
            config: Config = embedded.config()
        else:
            config = load_config(config_path)
            log.setup(log_level or config.log_level)
        config.host = host or config.host
        config.port = port or config.port
        gateway = Gateway(config)
        if embedded is not None:
            # uvicorn re-raises SIGTERM after its graceful shutdown, so a ``finally`` would not run:
            # stop the engines in the lifespan shutdown instead.
            gateway.on_stop.append(embedded.stop)
        limits = fit_descriptors(config.limits)
        server = uvicorn.Server(uvicorn_config(GatewayApp(gateway), config.host, config.port, limits))
        log.info("listening", url=f"http://{config.host}:{config.port}", embedded=embedded is not None)
        if embedded is not None:
            print(_try_line(config.host, config.port, embedded.model), flush=True)
        await server.serve()
    finally:
        if embedded is not None:
            embedded.stop()
