"""bidi-responses: the Responses API over a gRPC bidirectional stream.

Subpackages:
    bidi_responses.codec: the JSON <-> protobuf mapping, shared by server and client.
    bidi_responses.v1: code generated from ``protos/bidi_responses/v1/*.proto``.
    bidi_responses.server: the core, its transports (gRPC, HTTP+SSE, WebSocket) and engines.
    bidi_responses.client: the Python client library.
"""
