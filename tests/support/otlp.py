"""An OTLP/HTTP trace receiver on loopback: accepts ``POST /v1/traces`` (protobuf, gzip or not) as a
collector does, decodes every span with the OpenTelemetry protobuf definitions and keeps it."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanProto


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    status_code: str


def _value(value: AnyValue) -> Any:
    field = value.WhichOneof("value")
    return None if field is None else getattr(value, field)


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.headers.get("content-encoding") == "gzip":
                    data = gzip.decompress(data)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                receiver._keep(ExportTraceServiceRequest.FromString(data))
                body = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _keep(self, request: ExportTraceServiceRequest) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(
                        Span(
                            service=str(resource.get("service.name", "")),
                            name=span.name,
                            kind=SpanProto.SpanKind.Name(span.kind),
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            status_code=span.status.StatusCode.Name(span.status.code),
                        )
                    )
        with self._lock:
            self.requests += 1
            self.spans.extend(spans)

    def wait(self, match: Callable[[Span], bool], count: int = 1, timeout: float = 10.0) -> list[Span]:
        """The spans that ``match``, once at least ``count`` of them have arrived."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                found = [s for s in self.spans if match(s)]
            if len(found) >= count or time.monotonic() > deadline:
                assert len(found) >= count, f"{len(found)} of {count} spans after {timeout}s; got {self.spans}"
                return found
            time.sleep(0.05)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
