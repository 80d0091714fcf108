"""OpenTelemetry traces of inference requests and batch lines, configured by the standard
``OTEL_*`` environment variables through the OpenTelemetry SDK.

Rules:
- Off unless the environment asks for traces: ``OTEL_TRACES_EXPORTER`` naming an exporter
  (``otlp``, ``console``), or an OTLP endpoint (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``,
  ``OTEL_EXPORTER_OTLP_ENDPOINT``). ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``
  keep it off. Off, nothing of OpenTelemetry is imported and the proxy makes no span.
- Asked for without the SDK (the ``otel`` extra), or with an exporter or protocol it cannot
  use, the gateway does not start and says what is missing.
- Everything else is the SDK's own reading of the environment: ``OTEL_SERVICE_NAME`` (default
  ``priority-gateway``), ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``,
  ``OTEL_BSP_*``, ``OTEL_EXPORTER_OTLP_*`` (endpoint, headers, timeout, compression, TLS
  files), ``OTEL_PROPAGATORS`` (default W3C ``tracecontext,baggage``).
- One SERVER span per request, a child of the client's ``traceparent`` when it sent a valid one.
  The engine's request carries this span's ``traceparent``/``tracestate``, so an engine that
  traces (vLLM with ``--otlp-traces-endpoint``) records its own span under it. Attributes follow
  the HTTP server and GenAI semantic conventions where they apply, ``gateway.*`` elsewhere.
- A batch line is an INTERNAL span named after its batch, parent of the request span of each
  attempt that runs it.
- Spans leave from the SDK's batch processor thread, never from the event loop.
- Trace headers are client input: one over its W3C size (``TRACE_HEADER_BYTES``) is dropped
  before the propagator sees it, and said so in at most one short line every ``DROPPED_LOG_S``;
  the propagators' own warnings, which quote what the client sent, are not logged.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from priority_gateway import log
from priority_gateway.config.schema import ConfigError

if TYPE_CHECKING:
    from priority_gateway.http.exchange import Exchange

SERVICE_NAME = "priority-gateway"
EXTRA = "pip install 'priority-gateway[otel]'"
_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/v1/responses": "chat",
    "/v1/completions": "text_completion",
    "/v1/embeddings": "embeddings",
}
Headers = Sequence[tuple[bytes, bytes]]
# The W3C limits: traceparent and tracestate 512 characters, baggage 8,192 bytes.
TRACE_HEADER_BYTES = {b"traceparent": 512, b"tracestate": 512, b"baggage": 8192}
DROPPED_LOG_S = 10.0
_PROPAGATOR_LOGGERS = (
    "opentelemetry.baggage.propagation",
    "opentelemetry.trace.propagation",
    "opentelemetry.trace.span",
)


class TracingError(ConfigError):
    """Tracing is asked for but cannot run as asked: the gateway does not start."""


def wanted(environ: Mapping[str, str]) -> bool:
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER")
    if exporter is not None and exporter.strip():
        return exporter.strip().lower() != "none"
    return any(environ.get(name, "").strip() for name in _ENDPOINTS)


def from_environment(environ: Mapping[str, str] | None = None) -> Tracing | None:
    """The tracing the environment asks for, or None when it asks for none."""
    environ = os.environ if environ is None else environ
    if not wanted(environ):
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        asking = _asking(environ)
        missing = f"the OpenTelemetry SDK is not installed ({exc.name})"
        raise TracingError(f"tracing is asked for ({asking}) but {missing}: {EXTRA}") from None
    names = [n.strip().lower() for n in environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if n.strip()]
    exporters = [_exporter(name, environ) for name in names if name != "none"]
    own = "OTEL_SERVICE_NAME" in environ or "service.name=" in environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    provider = TracerProvider(resource=Resource.create({} if own else {"service.name": SERVICE_NAME}))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return Tracing(provider, names)


def _asking(environ: Mapping[str, str]) -> str:
    names = ["OTEL_TRACES_EXPORTER", *_ENDPOINTS]
    return ", ".join(f"{name}={environ[name]}" for name in names if environ.get(name))


def _exporter(name: str, environ: Mapping[str, str]) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name != "otlp":
        raise TracingError(f"OTEL_TRACES_EXPORTER={name!r}: the gateway exports traces with 'otlp' or 'console'")
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    if protocol == "http/protobuf":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise TracingError(f"OTLP over HTTP needs opentelemetry-exporter-otlp-proto-http: {EXTRA}") from None
        return OTLPSpanExporter()
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
        except ImportError:
            raise TracingError(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs opentelemetry-exporter-otlp-proto-grpc "
                "(pip install opentelemetry-exporter-otlp-proto-grpc), or use http/protobuf"
            ) from None
        return GrpcExporter()
    raise TracingError(f"OTLP protocol {protocol!r} is not supported: use http/protobuf (the default) or grpc")


class Tracing:
    def __init__(self, provider: Any, exporters: list[str]) -> None:
        from opentelemetry import propagate, trace

        self.provider = provider
        self.exporters = exporters
        self.tracer = provider.get_tracer("gateway")
        self._trace = trace
        self._propagator = propagate.get_global_textmap()
        self._fields = frozenset(name.encode() for name in self._propagator.fields)
        for name in _PROPAGATOR_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
        self.dropped = 0
        self._dropped_logged_at = -DROPPED_LOG_S

    def request(self, scope: Mapping[str, Any], headers: Headers) -> RequestSpan:
        """The span of one request, started now under the caller's trace context, if any."""
        carrier = {}
        agent = None
        for name, value in headers:
            if name in self._fields:
                if len(value) > TRACE_HEADER_BYTES.get(name, 8192):
                    self._drop(name, len(value))
                    continue
                carrier[name.decode()] = value.decode("latin-1")
            elif name == b"user-agent":
                agent = value.decode("latin-1")
        parent = self._propagator.extract(carrier) if carrier else None
        path = scope["path"]
        attributes: dict[str, Any] = {
            "http.request.method": scope["method"],
            "http.route": path,
            "url.path": path,
            "url.scheme": scope.get("scheme", "http"),
            "network.protocol.version": scope.get("http_version", "1.1"),
        }
        client = scope.get("client")
        if client:
            attributes["client.address"] = client[0]
        if agent is not None:
            attributes["user_agent.original"] = agent[:256]
        operation = _OPERATIONS.get(path)
        if operation is not None:
            attributes["gen_ai.operation.name"] = operation
        span = self.tracer.start_span(
            f"{scope['method']} {path}", context=parent, kind=self._trace.SpanKind.SERVER, attributes=attributes
        )
        return RequestSpan(self, span, parent)

    def _drop(self, name: bytes, size: int) -> None:
        self.dropped += 1
        now = time.monotonic()
        if now - self._dropped_logged_at >= DROPPED_LOG_S:
            self._dropped_logged_at = now
            limit = TRACE_HEADER_BYTES.get(name, 8192)
            log.info("trace_header_dropped", header=name.decode(), bytes=size, limit=limit, total=self.dropped)

    def batch_line(self, batch_id: str, custom_id: str) -> LineSpan:
        span = self.tracer.start_span(
            f"batch line {batch_id}",
            kind=self._trace.SpanKind.INTERNAL,
            attributes={"gateway.batch.id": batch_id, "gateway.batch.custom_id": custom_id},
        )
        return LineSpan(span, self.headers_for(span, None))

    def headers_for(self, span: Any, parent: Any) -> Headers:
        """The propagation headers (``traceparent``, ``tracestate``, baggage) that make ``span`` the parent."""
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=self._trace.set_span_in_context(span, parent))
        return [(name.encode(), value.encode("latin-1")) for name, value in carrier.items()]

    def shutdown(self) -> None:
        """Export what is left (within the processors' own timeouts) and stop."""
        self.provider.shutdown()


class RequestSpan:
    __slots__ = ("_parent", "_tracing", "span")

    def __init__(self, tracing: Tracing, span: Any, parent: Any) -> None:
        self._tracing = tracing
        self._parent = parent
        self.span = span

    def engine_headers(self) -> Headers:
        return self._tracing.headers_for(self.span, self._parent)

    def end(self, record: Exchange) -> None:
        span = self.span
        prompt, completion = record.usage()
        attributes: dict[str, Any] = {
            "gateway.request_id": record.request_id,
            "gateway.class": record.cls,
            "gateway.pool": record.pool,
            "gateway.engine": record.engine,
            "gateway.admission": record.admission,
            "gateway.stream": record.stream,
            "gateway.bytes_out": record.bytes_out,
        }
        if record.status:
            attributes["http.response.status_code"] = record.status
        if record.model is not None:
            attributes["gen_ai.request.model"] = record.model
            attributes["gen_ai.provider.name"] = "vllm"
        if record.key_id is not None:
            attributes["gateway.key_id"] = record.key_id
        if record.queue_wait_s is not None:
            attributes["gateway.queue_wait_s"] = record.queue_wait_s
        if record.ttft_s is not None:
            # vLLM's own span attribute for the same measure, so the two spans compare directly.
            attributes["gen_ai.latency.time_to_first_token"] = record.ttft_s
        if prompt is not None:
            attributes["gen_ai.usage.input_tokens"] = prompt
        elif record.prompt_estimate is not None:
            attributes["gateway.prompt_tokens_estimate"] = record.prompt_estimate
        if completion is not None:
            attributes["gen_ai.usage.output_tokens"] = completion
        if record.attempts > 1:
            attributes["gateway.attempts"] = record.attempts
        if record.error is not None:
            attributes["gateway.error"] = record.error
        if record.batch_id is not None:
            attributes["gateway.batch.id"] = record.batch_id
            attributes["gateway.batch.custom_id"] = record.custom_id or ""
        span.set_attributes(attributes)
        if record.status >= 500:
            # HTTP server spans: a 5xx is the server's error, a 4xx the client's (status unset).
            span.set_attribute("error.type", record.error or str(record.status))
            span.set_status(self._tracing._trace.StatusCode.ERROR, record.error)
        span.end()


class LineSpan:
    __slots__ = ("headers", "span")

    def __init__(self, span: Any, headers: Headers) -> None:
        self.span = span
        self.headers = headers

    def end(self, status: int) -> None:
        self.span.set_attribute("http.response.status_code", status)
        self.span.end()
