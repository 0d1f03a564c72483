"""The bidi-responses server: one core, three thin transports (gRPC, HTTP+SSE, WebSocket)."""
