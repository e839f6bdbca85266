"""A real OTLP trace receiver for the trace tests: gRPC (`TraceService/Export`) and HTTP/protobuf
(`POST /v1/traces`), both decoded with the OpenTelemetry project's own protobuf definitions
(`opentelemetry-proto`), so what idemgate sends is read by another implementation than the one that
wrote it. Every span received is kept as a plain dict; tests wait for the ones they expect.
"""

from __future__ import annotations

import base64
import json
import struct
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import grpc
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


class OtlpReceiver:
    """Listens on two loopback ports; `spans` holds every span received, newest last."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        self._files: dict[str, tuple[Path, Path]] = {}
        self._cond = threading.Condition()
        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Servicer(self), self._grpc)
        self.grpc_port = self._grpc.add_insecure_port("127.0.0.1:0")
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                if self.headers.get("content-type") != "application/x-protobuf":
                    self.send_error(415)
                    return
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._take(request, "http/protobuf", dict(self.headers.items()))
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http_port = self._http.server_address[1]

    def start(self) -> "OtlpReceiver":
        self._grpc.start()
        threading.Thread(target=self._http.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self._http.shutdown()
        self._grpc.stop(grace=None)

    def env(self, protocol: str) -> dict[str, str]:
        """The standard variables that point an exporter here over `protocol`."""
        if protocol == "grpc":
            endpoint = f"http://127.0.0.1:{self.grpc_port}"
        else:
            endpoint = f"http://127.0.0.1:{self.http_port}"
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
            # Short batches: a test waits for spans, it does not sleep for them.
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }

    def record(self, service: str, jsonl: Path, frames: Path) -> None:
        """From now on, writes the spans of `service` to files as the collector's `file` exporter
        does: OTLP JSON lines (`format: json`, ids in hex as the OTLP JSON encoding has them) and
        protobuf `TracesData` messages each preceded by its length, four bytes big-endian
        (`format: proto`)."""
        with self._cond:
            self._files[service] = (jsonl, frames)

    def _write(self, request: Any) -> None:
        for rs in request.resource_spans:
            service = next(
                (a.value.string_value for a in rs.resource.attributes if a.key == "service.name"),
                None,
            )
            if service not in self._files:
                continue
            jsonl, frames = self._files[service]
            data = TracesData()
            data.resource_spans.append(rs)
            doc = MessageToDict(data, use_integers_for_enums=True)
            for ss in doc.get("resourceSpans", [{}])[0].get("scopeSpans", []):
                for span in ss.get("spans", []):
                    for name in ("traceId", "spanId", "parentSpanId"):
                        if name in span:
                            span[name] = base64.b64decode(span[name]).hex()
            with jsonl.open("a") as f:
                f.write(json.dumps(doc, separators=(",", ":")) + "\n")
            body = data.SerializeToString()
            with frames.open("ab") as f:
                f.write(struct.pack(">I", len(body)) + body)

    def _take(self, request: Any, via: str, headers: dict[str, str]) -> None:
        taken = []
        for rs in request.resource_spans:
            resource = _attrs(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    taken.append(
                        {
                            "via": via,
                            "resource": resource,
                            "scope": ss.scope.name,
                            "name": s.name,
                            "kind": s.kind,
                            "trace_id": s.trace_id.hex(),
                            "span_id": s.span_id.hex(),
                            "parent_span_id": s.parent_span_id.hex(),
                            "start": s.start_time_unix_nano,
                            "end": s.end_time_unix_nano,
                            "attributes": _attrs(s.attributes),
                            "events": [
                                {"name": e.name, "attributes": _attrs(e.attributes)}
                                for e in s.events
                            ],
                            "status": s.status.code,
                        }
                    )
        with self._cond:
            self._write(request)
            self.requests.append({"via": via, "headers": headers})
            self.spans.extend(taken)
            self._cond.notify_all()

    def wait_for(
        self, want: Callable[[list[dict[str, Any]]], bool], timeout: float = 30.0
    ) -> list[dict[str, Any]]:
        """Every span received, once `want(spans)` holds; fails after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not want(self.spans):
                left = deadline - time.monotonic()
                if left <= 0:
                    names = [s["name"] for s in self.spans]
                    raise AssertionError(f"spans never arrived; received so far: {names}")
                self._cond.wait(left)
            return list(self.spans)


class _Servicer(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self.receiver = receiver

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 (the service's name)
        headers = {k: v for k, v in context.invocation_metadata()}
        self.receiver._take(request, "grpc", headers)
        return trace_service_pb2.ExportTraceServiceResponse()


if __name__ == "__main__":
    r = OtlpReceiver().start()
    print(f"grpc {r.grpc_port} http {r.http_port}", flush=True)
    seen = 0
    while True:
        spans = r.wait_for(lambda s: len(s) > seen, timeout=3600)
        for s in spans[seen:]:
            print(s, flush=True)
        seen = len(spans)
