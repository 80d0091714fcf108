"""Running the gateway under uvicorn, with or without embedded engines."""

from __future__ import annotations

import math
import os
import ssl

import uvicorn

from priority_gateway import log
from priority_gateway.config import Config, ConfigError, ListenConfig, Raw, load_config
from priority_gateway.config.env import PREFIX, unread
from priority_gateway.embedded import EmbeddedEngines
from priority_gateway.http.app import GatewayApp
from priority_gateway.http.connection import fit_descriptors, protocol_class
from priority_gateway.http.tracing import from_environment
from priority_gateway.keys.admin import with_admin_key
from priority_gateway.limits import ClientLimits
from priority_gateway.runtime import Gateway

# Pools from the environment make a configuration of their own, without a file.
POOLS_OVERRIDE = PREFIX + "POOLS__"


def uvicorn_config(app: GatewayApp, listen: ListenConfig, limits: ClientLimits) -> uvicorn.Config:
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
        server_header=False,
        date_header=False,
        log_level="warning",
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
    try:
        if config_path is None and not any(name.startswith(POOLS_OVERRIDE) for name in os.environ):
            embedded = EmbeddedEngines()
            config = load_config(base=embedded.settings(), flags=flags)
            log.setup(config.log_level)
            embedded.launch()
            await embedded.wait_ready()
        else:
            config = load_config(config_path, flags=flags)
            log.setup(config.log_level)
        ignored = unread(Config, os.environ)
        if ignored:
            log.warning(
                "environment_not_read", variables=",".join(ignored), why=f"overrides are {PREFIX}<SECTION>__<KEY>"
            )
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
        listen = config.listen
        check_certificate(listen)
        limits = fit_descriptors(config.limits)
        server = uvicorn.Server(uvicorn_config(GatewayApp(gateway), listen, limits))
        log.info("listening", url=f"{listen.scheme}://{listen.host}:{listen.port}", embedded=embedded is not None)
        if embedded is not None:
            print(_try_line(listen.host, listen.port, embedded.model), flush=True)
        await server.serve()
    finally:
        if embedded is not None:
            embedded.stop()


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
