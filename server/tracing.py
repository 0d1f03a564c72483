"""Optional OpenTelemetry tracing of the three transports (off by default).

``tracing = true`` (``--otel-tracing``) adds OpenTelemetry's own gRPC server interceptor and
ASGI middleware, so every gRPC call, HTTP request and WebSocket connection gets a server span
with the caller's trace context. Spans go to the global tracer provider: configure it (and an
exporter) the usual OpenTelemetry way, e.g. ``opentelemetry-instrument`` or your own start-up
code. Needs the ``otel`` extra: ``pip install 'bidi-responses[otel]'``.
"""

from __future__ import annotations

from typing import Any

_MISSING = "tracing needs the OpenTelemetry packages: pip install 'bidi-responses[otel]'"


def grpc_interceptors(enabled: bool) -> list[Any]:
    """The server interceptors to install (none when tracing is off)."""
    if not enabled:
        return []
    try:
        from opentelemetry.instrumentation.grpc import aio_server_interceptor
    except ImportError as error:
        raise RuntimeError(_MISSING) from error
    return [aio_server_interceptor()]  # type: ignore[no-untyped-call]


def wrap_asgi(app: Any, enabled: bool) -> Any:
    """The ASGI application, traced when ``enabled``: one span per request or connection.

    The per-message ``receive``/``send`` spans are left out: a streamed response would
    otherwise cost a span per event.
    """
    if not enabled:
        return app
    try:
        from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
    except ImportError as error:
        raise RuntimeError(_MISSING) from error
    return OpenTelemetryMiddleware(app, exclude_spans=["receive", "send"])
