"""The HTTP+SSE surface with a raw HTTP client: status codes, bodies and SSE framing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from bidi_responses.server.app import RunningServer
from bidi_responses.server.core.tenancy.tenants import tenant_from_authorization
from bidi_responses.server.transports.http import sse_frame, sse_stream

from tests.conftest import SHELL_TOOL, ServerFactory, make_config
from tests.http.conftest import http_client, parse_sse

# Every field a Response object must carry (nullable ones present as null).
RESPONSE_FIELDS = {
    "id",
    "object",
    "created_at",
    "completed_at",
    "status",
    "incomplete_details",
    "model",
    "previous_response_id",
    "instructions",
    "output",
    "error",
    "tools",
    "tool_choice",
    "truncation",
    "parallel_tool_calls",
    "text",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "temperature",
    "top_logprobs",
    "reasoning",
    "usage",
    "max_output_tokens",
    "max_tool_calls",
    "store",
    "background",
    "service_tier",
    "safety_identifier",
    "prompt_cache_key",
    "metadata",
}


def assert_error(
    response: httpx.Response, status: int, code: str, param: str | None = None
) -> dict[str, Any]:
    """The response is OpenAI's JSON error shape with this status, code and param."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    assert error["param"] == param
    assert isinstance(error["message"], str) and error["message"]
    return dict(error)


async def test_create_returns_a_complete_response_object(http: httpx.AsyncClient) -> None:
    async with asyncio.timeout(20):
        reply = await http.post("/v1/responses", json={"model": "sim-model", "input": "hello"})
        assert reply.status_code == 200
        assert reply.headers["content-type"] == "application/json"
        response = reply.json()
        assert set(response) >= RESPONSE_FIELDS
        assert response["object"] == "response"
        assert response["status"] == "completed"
        assert [item["type"] for item in response["output"]] == ["message"]
        assert response["output"][0]["content"][0]["text"]
        usage = response["usage"]
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"] > 0

        stored = (await http.get(f"/v1/responses/{response['id']}")).json()
        assert stored["id"] == response["id"]
        assert stored["output"] == response["output"]


async def test_sse_framing_one_event_per_write(http: httpx.AsyncClient) -> None:
    async with asyncio.timeout(20):
        chunks: list[bytes] = []
        # The SDK sends Accept: application/json even when streaming: the body decides.
        async with http.stream(
            "POST",
            "/v1/responses",
            headers={"accept": "application/json"},
            json={"model": "sim-model", "input": "hi", "stream": True, "tools": [SHELL_TOOL]},
        ) as reply:
            assert reply.status_code == 200
            assert reply.headers["content-type"].startswith("text/event-stream")
            async for chunk in reply.aiter_raw():
                chunks.append(chunk)
        # Each network chunk is one whole event: the server writes an event in one piece.
        for chunk in chunks:
            assert chunk.endswith(b"\n\n") and chunk.count(b"\n\n") == 1, chunk
        raw = b"".join(chunks)
        assert b"[DONE]" not in raw
        events = parse_sse(raw)
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        kinds = [e["type"] for e in events]
        assert kinds == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
        assert events[0]["response"]["usage"] is None
        assert set(events[0]["response"]) >= RESPONSE_FIELDS
        final = events[-1]["response"]
        stored = (await http.get(f"/v1/responses/{final['id']}")).json()
        assert stored["output"] == final["output"]


async def test_stream_is_decided_by_the_body_not_accept(http: httpx.AsyncClient) -> None:
    async with asyncio.timeout(20):
        reply = await http.post(
            "/v1/responses",
            headers={"accept": "text/event-stream"},
            json={"model": "sim-model", "input": "hi"},
        )
        assert reply.headers["content-type"] == "application/json"
        assert reply.json()["status"] == "completed"


async def test_tool_loop_continues_from_the_store(http: httpx.AsyncClient) -> None:
    async with asyncio.timeout(20):
        first = (
            await http.post(
                "/v1/responses",
                json={"model": "sim-model", "input": "list the files", "tools": [SHELL_TOOL]},
            )
        ).json()
        call = first["output"][0]
        assert call["type"] == "function_call"
        assert call["name"] == "exec_command"
        assert isinstance(orjson.loads(call["arguments"]), dict)
        second = (
            await http.post(
                "/v1/responses",
                json={
                    "model": "sim-model",
                    "previous_response_id": first["id"],
                    "tools": [SHELL_TOOL],
                    "input": [
                        {
                            "type": "function_call_output",
                            "call_id": call["call_id"],
                            "output": "a.txt",
                        }
                    ],
                },
            )
        ).json()
        assert second["status"] == "completed"
        assert second["previous_response_id"] == first["id"]
        # The whole history was rebuilt from the store, yet the prompt still begins with the
        # first response's whole context: that shared prefix is what cached_tokens reports,
        # as on a stream whose cache holds the state.
        usage = second["usage"]
        assert usage["input_tokens"] > first["usage"]["input_tokens"]
        cached = usage["input_tokens_details"]["cached_tokens"]
        assert first["usage"]["input_tokens"] < cached < usage["input_tokens"]


async def test_request_errors_use_the_openai_shape(http: httpx.AsyncClient) -> None:
    async with asyncio.timeout(20):
        assert_error(await http.post("/v1/responses", content=b"{not json"), 400, "invalid_json")
        assert_error(await http.post("/v1/responses", content=b"[1, 2]"), 400, "invalid_type")
        assert_error(
            await http.post("/v1/responses", json={"input": "hi"}),
            400,
            "missing_required_parameter",
            "model",
        )
        assert_error(
            await http.post(
                "/v1/responses", json={"model": "sim-model", "input": "hi", "temperature": "hot"}
            ),
            400,
            "invalid_type",
            "temperature",
        )
        error = assert_error(
            await http.post(
                "/v1/responses",
                json={"model": "sim-model", "input": "hi", "previous_response_id": "resp_missing"},
            ),
            400,
            "previous_response_not_found",
            "previous_response_id",
        )
        assert error["type"] == "invalid_request_error"
        assert "resp_missing" in error["message"]
        assert_error(
            await http.post(
                "/v1/responses",
                json={"model": "sim-model", "input": "hi", "background": True, "store": False},
            ),
            400,
            "invalid_value",
            "background",
        )
        assert_error(
            await http.post(
                "/v1/responses", json={"model": "sim-model", "input": "hi", "append_mode": True}
            ),
            400,
            "unsupported_parameter",
            "append_mode",
        )


async def test_streaming_request_errors_are_plain_4xx(http: httpx.AsyncClient) -> None:
    async with asyncio.timeout(20):
        reply = await http.post(
            "/v1/responses",
            json={
                "model": "sim-model",
                "input": "hi",
                "stream": True,
                "previous_response_id": "resp_missing",
            },
        )
        assert_error(reply, 400, "previous_response_not_found", "previous_response_id")


async def test_unknown_fields_and_client_item_ids_are_accepted(http: httpx.AsyncClient) -> None:
    async with asyncio.timeout(20):
        reply = await http.post(
            "/v1/responses",
            json={
                "model": "sim-model",
                "input": [
                    {
                        "type": "message",
                        "id": "msg_client_1",
                        "role": "developer",
                        "content": [{"type": "input_text", "text": "be brief"}],
                    },
                    {
                        "type": "message",
                        "role": "assistant",
                        "phase": "final_answer",
                        "content": [{"type": "output_text", "text": "earlier answer"}],
                    },
                    {"role": "user", "content": "and now?"},
                ],
                "include": ["reasoning.encrypted_content"],
                "client_metadata": {"turn_id": ""},
                "prompt_cache_key": "k",
                "reasoning": {"summary": "auto"},
                "text": {"verbosity": "low"},
                "some_future_field": {"x": 1},
            },
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["prompt_cache_key"] == "k"


async def test_retrieve_and_delete(http: httpx.AsyncClient) -> None:
    async with asyncio.timeout(20):
        assert_error(await http.get("/v1/responses/resp_nope"), 404, "not_found")
        assert_error(await http.delete("/v1/responses/resp_nope"), 404, "not_found")
        response = (
            await http.post("/v1/responses", json={"model": "sim-model", "input": "hi"})
        ).json()
        deleted = await http.delete(f"/v1/responses/{response['id']}")
        assert deleted.status_code == 200
        assert deleted.json() == {
            "id": response["id"],
            "object": "response.deleted",
            "deleted": True,
        }
        assert_error(await http.get(f"/v1/responses/{response['id']}"), 404, "not_found")
        assert_error(
            await http.get(f"/v1/responses/{response['id']}?stream=true"),
            400,
            "unsupported_parameter",
            "stream",
        )


async def test_input_items_cursor_paging(http: httpx.AsyncClient) -> None:
    async with asyncio.timeout(20):
        texts = [f"message {i}" for i in range(5)]
        response = (
            await http.post(
                "/v1/responses",
                json={
                    "model": "sim-model",
                    "input": [{"role": "user", "content": text} for text in texts],
                },
            )
        ).json()
        url = f"/v1/responses/{response['id']}/input_items"

        seen: list[str] = []
        after: str | None = None
        while True:
            params: dict[str, Any] = {"limit": 2, "order": "asc"}
            if after:
                params["after"] = after
            page = (await http.get(url, params=params)).json()
            assert page["object"] == "list"
            assert len(page["data"]) <= 2
            assert page["first_id"] == page["data"][0]["id"]
            assert page["last_id"] == page["data"][-1]["id"]
            seen += [item["content"][0]["text"] for item in page["data"]]
            if not page["has_more"]:
                break
            after = page["last_id"]
        assert seen == texts

        newest_first = (await http.get(url)).json()
        assert [i["content"][0]["text"] for i in newest_first["data"]] == texts[::-1]
        assert newest_first["has_more"] is False

        assert_error(await http.get(url, params={"limit": "x"}), 400, "invalid_type", "limit")
        assert_error(await http.get(url, params={"limit": 0}), 400, "invalid_value", "limit")
        assert_error(await http.get(url, params={"order": "up"}), 400, "invalid_value", "order")
        assert_error(
            await http.get(url, params={"after": "msg_nope"}), 400, "invalid_value", "after"
        )
        assert_error(await http.get("/v1/responses/resp_nope/input_items"), 404, "not_found")


async def test_cancel_an_in_flight_streaming_response(server_factory: ServerFactory) -> None:
    # A slow engine (20 tokens/s for a 30-token answer) keeps the response in flight.
    running: RunningServer = await server_factory(http=True, tokens_per_second=20)
    async with asyncio.timeout(20), http_client(running) as http:
        raw = b""
        async with http.stream(
            "POST", "/v1/responses", json={"model": "sim-model", "input": "hi", "stream": True}
        ) as reply:
            chunks = reply.aiter_raw()
            created = parse_sse(await anext(chunks))[0]
            assert created["type"] == "response.created"
            response_id = created["response"]["id"]
            cancelled = await http.post(f"/v1/responses/{response_id}/cancel")
            assert cancelled.status_code == 200
            assert cancelled.json()["id"] == response_id
            assert cancelled.json()["status"] == "cancelled"
            async for chunk in chunks:
                raw += chunk
        final = parse_sse(raw)[-1]
        assert final["type"] == "response.incomplete"
        assert final["response"]["incomplete_details"] == {"reason": "cancelled"}
        assert_error(await http.post("/v1/responses/resp_nope/cancel"), 404, "not_found")


async def test_body_over_the_message_limit_is_413(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    config = make_config(tmp_path)
    config.limits.max_message_bytes = 4096
    running: RunningServer = await server_factory(config, http=True)
    async with asyncio.timeout(20), http_client(running) as http:
        big = {"model": "sim-model", "input": "x" * 5000}
        assert_error(await http.post("/v1/responses", json=big), 413, "request_too_large")

        async def chunked() -> Any:
            # No Content-Length: the limit is enforced while reading.
            for _ in range(3):
                yield b" " * 2000

        assert_error(await http.post("/v1/responses", content=chunked()), 413, "request_too_large")
        small = await http.post("/v1/responses", json={"model": "sim-model", "input": "hi"})
        assert small.status_code == 200


async def test_bearer_token_names_the_tenant(
    http_server: RunningServer, http: httpx.AsyncClient
) -> None:
    # On an open server the token's label is whom the ledger charges; the response echoes
    # ``user`` only when the client sent it (the caller is never written into the body).
    async with asyncio.timeout(20):
        reply = await http.post(
            "/v1/responses",
            headers={"authorization": "Bearer sk-abc"},
            json={"model": "sim-model", "input": "hi"},
        )
        tenant = tenant_from_authorization("Bearer sk-abc")
        assert tenant is not None and "sk-abc" not in tenant
        assert reply.json()["user"] is None
        explicit = await http.post(
            "/v1/responses",
            headers={"authorization": "Bearer sk-abc"},
            json={"model": "sim-model", "input": "hi", "user": "alice"},
        )
        assert explicit.json()["user"] == "alice"
        anonymous = await http.post("/v1/responses", json={"model": "sim-model", "input": "hi"})
        assert anonymous.json()["user"] is None
        await http_server.core.deps.post.join()
        rows = {r.response_id: r.tenant for r in await http_server.core.deps.store.ledger_rows()}
        assert rows[reply.json()["id"]] == tenant
        assert rows[explicit.json()["id"]] == "alice"
        assert rows[anonymous.json()["id"]] == "anonymous"


async def test_stats_health_and_routing_errors(http: httpx.AsyncClient) -> None:
    async with asyncio.timeout(20):
        await http.post("/v1/responses", json={"model": "sim-model", "input": "hi"})
        stats = await http.get("/v1/stats")
        assert stats.status_code == 200
        assert isinstance(stats.json(), dict) and "streams_open" in stats.json()
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        plain_get = await http.get("/v1/responses")
        assert_error(plain_get, 426, "upgrade_required")
        assert plain_get.headers["upgrade"] == "websocket"
        assert_error(await http.get("/v1/nothing"), 404, "not_found")
        not_allowed = await http.put("/v1/responses")
        assert_error(not_allowed, 405, "method_not_allowed")
        assert "POST" in not_allowed.headers["allow"]


async def test_sse_error_after_start_is_flat() -> None:
    # The core only reports errors before response.created on HTTP, but a later one must
    # still be the flat ResponseErrorEvent the SDK parses (a nested 'error' makes it raise).
    async def rest() -> Any:
        yield {
            "type": "error",
            "status": 500,
            "error": {
                "type": "server_error",
                "code": "server_error",
                "message": "boom",
                "param": None,
            },
        }

    first = {"type": "response.created", "response": {"id": "resp_1"}, "sequence_number": 0}
    async with asyncio.timeout(5):
        frames = [frame async for frame in sse_stream(first, rest())]
    events = parse_sse(b"".join(frames))
    assert events[1] == {
        "type": "error",
        "code": "server_error",
        "message": "boom",
        "param": None,
        "sequence_number": 1,
    }


@pytest.mark.parametrize("text", ["line\nbreak", "cr\r\nlf", "unicode \u2028 sep"])
def test_sse_frame_is_one_data_line(text: str) -> None:
    frame = sse_frame({"type": "response.output_text.delta", "delta": text})
    assert frame.count(b"\n") == 3 and b"\r" not in frame
    assert parse_sse(frame)[0]["delta"] == text
