"""Compact, input token counts, models, structured outputs and background mode over raw HTTP,
shaped by the Open Responses specification (CompactResource, TokenCountsResource, Model list)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from bidi_responses.server.app import RunningServer

from tests.conftest import SHELL_TOOL, ServerFactory, background_config, make_config
from tests.http.conftest import http_client, parse_sse
from tests.http.test_http_api import assert_error

USAGE_FIELDS = {
    "input_tokens",
    "input_tokens_details",
    "output_tokens",
    "output_tokens_details",
    "total_tokens",
}


async def _tool_turns(http: httpx.AsyncClient) -> dict[str, Any]:
    """A stored two-response conversation: a tool call, then its answer."""
    first = (
        await http.post(
            "/v1/responses",
            json={"model": "sim-model", "input": "fix the test", "tools": [SHELL_TOOL]},
        )
    ).json()
    call = first["output"][0]
    second = await http.post(
        "/v1/responses",
        json={
            "model": "sim-model",
            "tools": [SHELL_TOOL],
            "previous_response_id": first["id"],
            "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}],
        },
    )
    response: dict[str, Any] = second.json()
    return response


# -- compact -----------------------------------------------------------------------------------


async def test_compact_returns_the_spec_shape(http: httpx.AsyncClient) -> None:
    async with asyncio.timeout(20):
        last = await _tool_turns(http)
        reply = await http.post(
            "/v1/responses/compact", json={"model": "sim-model", "previous_response_id": last["id"]}
        )
        assert reply.status_code == 200
        assert reply.headers["content-type"] == "application/json"
        body = reply.json()
        assert set(body) == {
            "id",
            "object",
            "created_at",
            "output",
            "usage",
            "safety_identifier",
            "service_tier",
        }
        assert body["object"] == "response.compaction"
        assert body["id"].startswith("resp_") and isinstance(body["created_at"], int)
        # All user messages, then a single compaction item.
        *kept, compaction = body["output"]
        assert [(i["type"], i["role"]) for i in kept] == [("message", "user")]
        assert kept[0]["content"] == [{"type": "input_text", "text": "fix the test"}]
        assert kept[0]["id"] and kept[0]["status"] == "completed"
        assert set(compaction) == {"id", "type", "encrypted_content"}
        assert compaction["type"] == "compaction" and compaction["id"].startswith("cmp_")
        # Opaque: the tool call's arguments are summarized inside, never readable.
        assert "exec_command" not in compaction["encrypted_content"]
        usage = body["usage"]
        assert set(usage) == USAGE_FIELDS
        # The whole conversation was read (what input_tokens counts for it, without tools).
        count = await http.post(
            "/v1/responses/input_tokens", json={"previous_response_id": last["id"]}
        )
        assert usage["input_tokens"] == count.json()["input_tokens"]
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"] > 0


async def test_continuing_from_a_compaction_is_shorter_and_keeps_working(
    http: httpx.AsyncClient,
) -> None:
    async with asyncio.timeout(20):
        last = await _tool_turns(http)
        compacted = (
            await http.post(
                "/v1/responses/compact",
                json={"model": "sim-model", "previous_response_id": last["id"]},
            )
        ).json()
        follow = {
            "model": "sim-model",
            "tools": [SHELL_TOOL],
            "input": [*compacted["output"], {"role": "user", "content": "go on"}],
        }
        reply = await http.post("/v1/responses", json=follow)
        assert reply.status_code == 200, reply.text
        response = reply.json()
        assert response["status"] == "completed"
        count = (await http.post("/v1/responses/input_tokens", json=follow)).json()
        assert count == {
            "object": "response.input_tokens",
            "input_tokens": response["usage"]["input_tokens"],
        }
        # Stored like any input: the compaction item is listed and continues again.
        items = (await http.get(f"/v1/responses/{response['id']}/input_items")).json()["data"]
        assert "compaction" in [i["type"] for i in items]
        again = await http.post(
            "/v1/responses",
            json={"model": "sim-model", "previous_response_id": response["id"], "input": "more"},
        )
        assert again.json()["status"] == "completed"


async def test_compact_errors(http: httpx.AsyncClient) -> None:
    async with asyncio.timeout(20):
        assert_error(
            await http.post("/v1/responses/compact", json={"input": "hi"}),
            400,
            "missing_required_parameter",
            "model",
        )
        assert_error(
            await http.post("/v1/responses/compact", json={"model": 7}),
            400,
            "invalid_type",
            "model",
        )
        assert_error(
            await http.post(
                "/v1/responses/compact",
                json={"model": "sim-model", "previous_response_id": "resp_missing"},
            ),
            400,
            "previous_response_not_found",
            "previous_response_id",
        )
        assert_error(
            await http.post(
                "/v1/responses/compact",
                json={"model": "sim-model", "input": [{"type": "compaction"}]},
            ),
            400,
            "missing_required_parameter",
            "input[0].encrypted_content",
        )
        reply = await http.post(
            "/v1/responses/compact", content=b"{oops", headers={"content-type": "application/json"}
        )
        assert_error(reply, 400, "invalid_json")
        # "compact" is an operation, not a response id.
        assert_error(await http.get("/v1/responses/compact"), 404, "not_found")


async def test_a_tampered_compaction_item_is_refused_by_name(http: httpx.AsyncClient) -> None:
    async with asyncio.timeout(20):
        compacted = (
            await http.post("/v1/responses/compact", json={"model": "sim-model", "input": "hi"})
        ).json()
        item = dict(compacted["output"][-1])
        token = item["encrypted_content"]
        item["encrypted_content"] = token[:-3] + ("AAA" if token[-3:] != "AAA" else "BBB")
        assert_error(
            await http.post(
                "/v1/responses",
                json={"model": "sim-model", "input": [{"role": "user", "content": "x"}, item]},
            ),
            400,
            "invalid_encrypted_content",
            "input[1].encrypted_content",
        )


async def test_compaction_items_survive_a_restart(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    async with asyncio.timeout(30):
        config = make_config(tmp_path)
        first: RunningServer = await server_factory(config, http=True)
        async with http_client(first) as http:
            compacted = (
                await http.post(
                    "/v1/responses/compact", json={"model": "sim-model", "input": "hello"}
                )
            ).json()
        await first.stop(grace=0)
        second: RunningServer = await server_factory(make_config(tmp_path), http=True)
        async with http_client(second) as http:
            reply = await http.post(
                "/v1/responses", json={"model": "sim-model", "input": compacted["output"]}
            )
            assert reply.status_code == 200, reply.text


# -- input_tokens ------------------------------------------------------------------------------


async def test_input_tokens_equal_the_usage_of_the_same_create(http: httpx.AsyncClient) -> None:
    async with asyncio.timeout(20):
        fmt = {
            "type": "json_schema",
            "name": "answer",
            "schema": {"type": "object", "properties": {"ok": {"type": "boolean"}}},
        }
        body = {
            "model": "sim-model",
            "instructions": "Be brief.",
            "input": "list the files",
            "tools": [SHELL_TOOL],
            "text": {"format": fmt},
        }
        count = (await http.post("/v1/responses/input_tokens", json=body)).json()
        created = (await http.post("/v1/responses", json=body)).json()
        assert count["object"] == "response.input_tokens"
        assert count["input_tokens"] == created["usage"]["input_tokens"]
        # No model is fine (the spec makes it optional); the count does not change with it.
        without = {k: v for k, v in body.items() if k != "model"}
        assert (await http.post("/v1/responses/input_tokens", json=without)).json() == count
        # A continuation counts the stored history too.
        call = created["output"][0]
        follow = {
            "model": "sim-model",
            "tools": [SHELL_TOOL],
            "previous_response_id": created["id"],
            "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "x"}],
        }
        count = (await http.post("/v1/responses/input_tokens", json=follow)).json()
        created = (await http.post("/v1/responses", json=follow)).json()
        assert count["input_tokens"] == created["usage"]["input_tokens"]


async def test_input_tokens_errors(http: httpx.AsyncClient) -> None:
    async with asyncio.timeout(20):
        assert_error(
            await http.post("/v1/responses/input_tokens", json={"model": "nope", "input": "x"}),
            400,
            "model_not_found",
            "model",
        )
        assert_error(
            await http.post("/v1/responses/input_tokens", json={"input": 3}),
            400,
            "invalid_type",
            "input",
        )
        assert_error(await http.post("/v1/responses/input_tokens", json=[1]), 400, "invalid_type")


# -- models ------------------------------------------------------------------------------------


async def test_models_list_and_retrieve(http: httpx.AsyncClient) -> None:
    async with asyncio.timeout(20):
        listing = (await http.get("/v1/models")).json()
        assert listing["object"] == "list"
        assert [m["id"] for m in listing["data"]] == ["sim-model", "sim-other"]
        for model in listing["data"]:
            assert set(model) == {"id", "object", "created", "owned_by"}
            assert model["object"] == "model" and model["owned_by"] == "sim"
        one = (await http.get("/v1/models/sim-model")).json()
        assert one == listing["data"][0]
        assert_error(await http.get("/v1/models/org/unknown"), 404, "model_not_found", "model")


# -- structured outputs and echoed parameters --------------------------------------------------


async def test_json_schema_output_is_valid_and_the_parameters_are_echoed(
    http: httpx.AsyncClient,
) -> None:
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "minLength": 2},
            "population": {"type": "integer", "minimum": 1},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}},
        },
        "required": ["city", "population", "tags"],
        "additionalProperties": False,
    }
    body = {
        "model": "sim-model",
        "input": "a city",
        "text": {
            "format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True},
            "verbosity": "medium",
        },
        "reasoning": {"effort": "low", "summary": "auto"},
        "truncation": "auto",
        "include": ["reasoning.encrypted_content"],
        "max_tool_calls": 2,
    }
    async with asyncio.timeout(20):
        response = (await http.post("/v1/responses", json=body)).json()
        assert response["text"] == body["text"]
        assert response["reasoning"] == body["reasoning"]
        assert response["truncation"] == "auto"
        assert response["max_tool_calls"] == 2
        value = orjson.loads(response["output"][0]["content"][0]["text"])
        assert set(value) == {"city", "population", "tags"}
        assert isinstance(value["city"], str) and len(value["city"]) >= 2
        assert isinstance(value["population"], int) and value["population"] >= 1
        assert set(value["tags"]) <= {"a", "b"}
        # The stored response echoes the same.
        stored = (await http.get(f"/v1/responses/{response['id']}")).json()
        assert stored["text"] == body["text"] and stored["reasoning"] == body["reasoning"]

        obj = (
            await http.post(
                "/v1/responses",
                json={
                    "model": "sim-model",
                    "input": "JSON please",
                    "text": {"format": {"type": "json_object"}},
                },
            )
        ).json()
        assert obj["text"] == {"format": {"type": "json_object"}}
        assert isinstance(orjson.loads(obj["output"][0]["content"][0]["text"]), dict)


@pytest.mark.parametrize(
    ("extra", "code", "param"),
    [
        ({"text": {"format": {"type": "xml"}}}, "invalid_value", "text.format.type"),
        (
            {"text": {"format": {"type": "json_schema", "schema": {"type": "object"}}}},
            "missing_required_parameter",
            "text.format.name",
        ),
        (
            {"text": {"format": {"type": "json_schema", "name": "a b", "schema": {}}}},
            "invalid_value",
            "text.format.name",
        ),
        (
            {"text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "array"}}}},
            "invalid_value",
            "text.format.schema.type",
        ),
        (
            {
                "text": {
                    "format": {
                        "type": "json_schema",
                        "name": "n",
                        "strict": True,
                        "schema": {
                            "type": "object",
                            "properties": {"a": {"type": "string"}},
                            "additionalProperties": False,
                        },
                    }
                }
            },
            "invalid_json_schema",
            "text.format.schema.required",
        ),
        ({"text": {"verbosity": "loud"}}, "invalid_value", "text.verbosity"),
        ({"reasoning": {"effort": "huge"}}, "invalid_value", "reasoning.effort"),
        ({"truncation": "sometimes"}, "invalid_value", "truncation"),
        ({"include": ["everything"]}, "invalid_value", "include[0]"),
        (
            {"include": ["reasoning.encrypted_content", "message.output_text.logprobs"]},
            "unsupported_value",
            "include[1]",
        ),
        ({"max_tool_calls": 0}, "invalid_value", "max_tool_calls"),
        ({"conversation": "conv_1"}, "unsupported_parameter", "conversation"),
        ({"prompt": {"id": "pmpt_1"}}, "unsupported_parameter", "prompt"),
        ({"top_logprobs": 5}, "unsupported_parameter", "top_logprobs"),
    ],
)
async def test_parameters_the_server_cannot_honour_get_a_400_naming_them(
    http: httpx.AsyncClient, extra: dict[str, Any], code: str, param: str
) -> None:
    async with asyncio.timeout(20):
        reply = await http.post("/v1/responses", json={"model": "sim-model", "input": "x", **extra})
        assert_error(reply, 400, code, param)


# -- background mode ---------------------------------------------------------------------------


async def _until(http: httpx.AsyncClient, response_id: str, statuses: set[str]) -> dict[str, Any]:
    """Poll GET /v1/responses/{id} until its status is one of ``statuses``."""
    while True:
        response: dict[str, Any] = (await http.get(f"/v1/responses/{response_id}")).json()
        if response["status"] in statuses:
            return response
        await asyncio.sleep(0.02)


@pytest.fixture
async def slow_http(
    server_factory: ServerFactory, tmp_path: Path
) -> AsyncIterator[httpx.AsyncClient]:
    """A server with the background-test routes (``background_config``)."""
    server: RunningServer = await server_factory(background_config(tmp_path), http=True)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{server.http_port}", timeout=10
    ) as client:
        yield client


async def test_background_returns_queued_then_polls_to_completion(
    http: httpx.AsyncClient,
) -> None:
    async with asyncio.timeout(20):
        reply = await http.post(
            "/v1/responses", json={"model": "sim-model", "input": "hi", "background": True}
        )
        assert reply.status_code == 200
        queued = reply.json()
        assert queued["status"] == "queued" and queued["background"] is True
        assert queued["output"] == [] and queued["usage"] is None
        done = await _until(http, queued["id"], {"completed"})
        assert done["background"] is True and done["output"][0]["type"] == "message"
        assert done["usage"]["output_tokens"] > 0


async def test_background_cancel(slow_http: httpx.AsyncClient) -> None:
    async with asyncio.timeout(20):
        http = slow_http
        queued = (
            await http.post(
                "/v1/responses", json={"model": "sim-other", "input": "hi", "background": True}
            )
        ).json()
        await _until(http, queued["id"], {"in_progress"})
        cancelled = (await http.post(f"/v1/responses/{queued['id']}/cancel")).json()
        assert cancelled["status"] == "cancelled"
        assert (await http.get(f"/v1/responses/{queued['id']}")).json()["status"] == "cancelled"


async def test_background_stream_resumes_after_a_disconnect(slow_http: httpx.AsyncClient) -> None:
    async with asyncio.timeout(30):
        http = slow_http
        seen: list[dict[str, Any]] = []
        body = {"model": "sim-model", "input": "hi", "background": True, "stream": True}
        async with http.stream("POST", "/v1/responses", json=body) as reply:
            assert reply.status_code == 200
            async for line in reply.aiter_lines():
                if line.startswith("data: "):
                    seen.append(orjson.loads(line[6:]))
                if len(seen) == 5:
                    break  # the client goes away mid-response
        assert seen[0]["type"] == "response.created"
        assert seen[0]["response"]["status"] == "queued"
        response_id = seen[0]["response"]["id"]
        # The response went on without its client.
        assert (await http.get(f"/v1/responses/{response_id}")).json()["status"] in (
            "in_progress",
            "completed",
        )
        last = seen[-1]["sequence_number"]
        resumed = await http.get(
            f"/v1/responses/{response_id}", params={"stream": "true", "starting_after": last}
        )
        assert resumed.status_code == 200
        assert resumed.headers["content-type"].startswith("text/event-stream")
        rest = parse_sse(resumed.content)
        numbers = [e["sequence_number"] for e in seen + rest]
        assert numbers == list(range(len(numbers)))
        assert rest[-1]["type"] == "response.completed"
        text = "".join(e["delta"] for e in seen + rest if e["type"] == "response.output_text.delta")
        assert text == rest[-1]["response"]["output"][0]["content"][0]["text"]
        # From the start, the same events again.
        again = parse_sse(
            (await http.get(f"/v1/responses/{response_id}", params={"stream": "true"})).content
        )
        assert [e["sequence_number"] for e in again] == numbers


async def test_background_event_log_is_bounded(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    config = make_config(tmp_path)
    config.background.max_events = 4
    server: RunningServer = await server_factory(config, http=True)
    async with asyncio.timeout(20), http_client(server) as http:
        queued = (
            await http.post(
                "/v1/responses", json={"model": "sim-model", "input": "hi", "background": True}
            )
        ).json()
        done = await _until(http, queued["id"], {"completed"})
        path = f"/v1/responses/{done['id']}"
        assert_error(
            await http.get(path, params={"stream": "true", "starting_after": 0}),
            400,
            "invalid_value",
            "starting_after",
        )
        kept = await http.get(path, params={"stream": "true", "starting_after": 1000})
        assert kept.status_code == 200 and kept.content == b""


async def test_background_errors(http: httpx.AsyncClient) -> None:
    async with asyncio.timeout(20):
        # A bad background request is still a plain 4xx, at once.
        assert_error(
            await http.post(
                "/v1/responses", json={"model": "nope", "input": "hi", "background": True}
            ),
            400,
            "model_not_found",
            "model",
        )
        plain = (await http.post("/v1/responses", json={"model": "sim-model", "input": "x"})).json()
        assert_error(
            await http.get(f"/v1/responses/{plain['id']}", params={"stream": "true"}),
            400,
            "unsupported_parameter",
            "stream",
        )
        queued = (
            await http.post(
                "/v1/responses", json={"model": "sim-model", "input": "hi", "background": True}
            )
        ).json()
        assert_error(
            await http.get(
                f"/v1/responses/{queued['id']}", params={"stream": "true", "starting_after": "x"}
            ),
            400,
            "invalid_type",
            "starting_after",
        )


async def test_schema_references_must_resolve(http: httpx.AsyncClient) -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/missing"}},
        "$defs": {"present": {"type": "string"}},
    }
    fmt = {"type": "json_schema", "name": "r", "schema": schema}
    async with asyncio.timeout(20):
        assert_error(
            await http.post(
                "/v1/responses", json={"model": "sim-model", "input": "x", "text": {"format": fmt}}
            ),
            400,
            "invalid_json_schema",
            "text.format.schema.properties.a.$ref",
        )
        schema["properties"] = {"a": {"$ref": "#/$defs/present"}}
        schema["required"] = ["a"]
        reply = await http.post(
            "/v1/responses", json={"model": "sim-model", "input": "x", "text": {"format": fmt}}
        )
        assert isinstance(orjson.loads(reply.json()["output"][0]["content"][0]["text"])["a"], str)


async def test_background_responses_are_bounded_and_stopped_with_the_server(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    config = make_config(tmp_path, tokens_per_second=100, answer_tokens=1000)
    config.background.max_running = 1
    server: RunningServer = await server_factory(config, http=True)
    async with asyncio.timeout(20), http_client(server) as http:
        body = {"model": "sim-model", "input": "hi", "background": True}
        running = (await http.post("/v1/responses", json=body)).json()
        assert running["status"] == "queued"
        reply = await http.post("/v1/responses", json=body)
        assert_error(reply, 429, "rate_limit_exceeded")
        await _until(http, running["id"], {"in_progress"})
    # Still running (about 10 s left): stopping the server ends it without waiting.
    async with asyncio.timeout(10):
        await server.stop(grace=0)
    assert server.core.background.is_background(running["id"])


async def test_compaction_is_accounted_in_the_usage_ledger(
    http_server: RunningServer, http: httpx.AsyncClient
) -> None:
    async with asyncio.timeout(20):
        reply = await http.post(
            "/v1/responses/compact",
            json={"model": "sim-model", "input": "hello"},
            headers={"authorization": "Bearer secret-key"},
        )
        compacted = reply.json()
        await http_server.core.deps.post.join()
        rows = {r.response_id: r for r in await http_server.core.deps.store.ledger_rows()}
        row = rows[compacted["id"]]
        assert row.status == "compaction" and row.transport == "http"
        assert row.tenant.startswith("key_")
        assert (row.input_tokens, row.output_tokens) == (
            compacted["usage"]["input_tokens"],
            compacted["usage"]["output_tokens"],
        )
