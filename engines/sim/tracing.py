"""vLLM's request tracing (``--otlp-traces-endpoint``), for the simulated engine.

Rules (after ``vllm/tracing`` and ``vllm/v1/engine/output_processor.py``):
- Off unless ``--otlp-traces-endpoint`` is given. On, every finished generation request is one
  SERVER span named ``llm_request``, from its arrival to its end, exported over OTLP
  (``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``: ``grpc`` by default, as vLLM, or ``http/protobuf``).
- Its parent is the trace context of the request's ``traceparent``/``tracestate`` headers, when
  they hold one: a caller that traces sees the engine's span under its own.
- Attributes are vLLM's: the request id, prompt and completion tokens, end-to-end latency, the
  model that answered.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

TRACE_HEADERS = (b"traceparent", b"tracestate")


def trace_headers(raw: list[tuple[bytes, bytes]]) -> dict[str, str]:
    return {name.decode(): value.decode("latin-1") for name, value in raw if name in TRACE_HEADERS}


class RequestTracer:
    def __init__(self, endpoint: str) -> None:
        try:
            from opentelemetry import trace
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError as exc:
            raise ValueError(f"--otlp-traces-endpoint needs the OpenTelemetry SDK ({exc.name})") from None
        protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
        if protocol == "grpc":
            try:
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc
            except ImportError:
                raise ValueError("OTLP over gRPC needs opentelemetry-exporter-otlp-proto-grpc") from None
            exporter: Any = Grpc(endpoint=endpoint, insecure=True)
        elif protocol == "http/protobuf":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

            exporter = Http(endpoint=endpoint)
        else:
            raise ValueError(f"Unsupported OTLP protocol '{protocol}' is configured")
        self._provider = TracerProvider(resource=Resource.create({"vllm.process_id": str(os.getpid())}))
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("vllm.entrypoints.openai")
        self._propagator = TraceContextTextMapPropagator()
        self._kind = trace.SpanKind.SERVER

    def finished(self, headers: Mapping[str, str], arrival_ns: int, attributes: dict[str, Any]) -> None:
        context = self._propagator.extract(dict(headers)) if headers else None
        attributes["gen_ai.latency.e2e"] = (time.time_ns() - arrival_ns) / 1e9
        span = self._tracer.start_span(
            "llm_request", context=context, kind=self._kind, start_time=arrival_ns, attributes=attributes
        )
        span.end()

    def shutdown(self) -> None:
        self._provider.shutdown()
