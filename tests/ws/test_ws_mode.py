"""WebSocket mode with raw frames: turns, the connection cache, lanes, append, bad frames."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from bidi_responses.server.app import RunningServer, start_server
from bidi_responses.server.core.tenancy.tenants import tenant_from_authorization
from websockets.frames import Frame, Opcode

from tests.conftest import SHELL_TOOL, ServerFactory, make_config
from tests.ws.conftest import TERMINAL, Connect, RawSocket, connector, error_of, final

TOOLS = [SHELL_TOOL]


async def answer_tools(
    sock: RawSocket, first: dict[str, Any], answer: list[dict[str, Any]] | None = None, **body: Any
) -> list[dict[str, Any]]:
    """Continue from ``first`` with ``answer`` (default: "ok" for each of its calls)."""
    return await sock.create(
        model="sim-model",
        tools=TOOLS,
        previous_response_id=first["id"],
        input=call_output(first) if answer is None else answer,
        **body,
    )


def call_output(response: dict[str, Any], output: str = "ok") -> list[dict[str, Any]]:
    """function_call_output items answering every call in ``response``."""
    calls = [item for item in response["output"] if item["type"] == "function_call"]
    assert calls, response["output"]
    return [
        {"type": "function_call_output", "call_id": c["call_id"], "output": output} for c in calls
    ]


async def test_text_turn_ignores_stream_and_follows_the_event_order(connect: Connect) -> None:
    async with asyncio.timeout(20), connect() as sock:
        events = await sock.create(model="sim-model", input="hi", stream=True)
        assert [e["type"] for e in events] == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert all("stream_id" not in e for e in events)
        assert final(events)["status"] == "completed"


async def test_nothing_is_sent_after_a_terminal_or_error_event(connect: Connect) -> None:
    # The next create goes out as soon as a turn ends; if anything of the old turn followed,
    # it would arrive before the new turn's response.created.
    async with asyncio.timeout(20), connect() as sock:
        first = final(await sock.create(model="sim-model", input="hi"))
        await sock.send({"type": "response.create", "model": "sim-model", "input": "again"})
        created = await sock.recv()
        assert created["type"] == "response.created"
        assert created["response"]["id"] != first["id"]
        assert (await sock.turn())[-1]["type"] == "response.completed"

        error_of(await sock.create(model="sim-model", input="x", previous_response_id="r_x"))
        await sock.send({"type": "response.create", "model": "sim-model", "input": "after"})
        assert (await sock.recv())["type"] == "response.created"
        await sock.turn()


async def test_tool_loop_continues_from_the_connection_cache(connect: Connect) -> None:
    async with asyncio.timeout(20), connect() as sock:
        first = final(await sock.create(model="sim-model", input="ls", tools=TOOLS, store=False))
        second = final(await answer_tools(sock, first, store=False))
        assert second["status"] == "completed"
        assert second["previous_response_id"] == first["id"]
        usage = second["usage"]
        # The cached tokens are the whole first turn: its input and its rendered output.
        cached = usage["input_tokens_details"]["cached_tokens"]
        assert first["usage"]["input_tokens"] < cached < usage["input_tokens"]


async def test_background_is_rejected_and_the_socket_stays_usable(connect: Connect) -> None:
    async with asyncio.timeout(20), connect() as sock:
        error = error_of(await sock.create(model="sim-model", input="hi", background=True))
        assert error["param"] == "background"
        assert error["type"] == "invalid_request_error"
        assert final(await sock.create(model="sim-model", input="hi"))["status"] == "completed"


async def test_unknown_previous_response_has_the_documented_shape(connect: Connect) -> None:
    async with asyncio.timeout(20), connect() as sock:
        events = await sock.create(model="sim-model", input="hi", previous_response_id="resp_gone")
        assert events == [
            {
                "type": "error",
                "status": 400,
                "error": {
                    "type": "invalid_request_error",
                    "code": "previous_response_not_found",
                    "message": "Previous response with id 'resp_gone' not found.",
                    "param": "previous_response_id",
                    # Which request the error answers (extra fields clients tolerate).
                    "request_type": "response.create",
                    "response_id": "resp_gone",
                },
            }
        ]


async def test_store_false_lives_only_on_its_connection(connect: Connect) -> None:
    async with asyncio.timeout(20):
        async with connect() as sock:
            unstored = final(await sock.create(model="sim-model", input="a", store=False))
            stored = final(await sock.create(model="sim-model", input="b", store=True))
        async with connect() as other:
            error = error_of(
                await other.create(
                    model="sim-model", input="c", previous_response_id=unstored["id"]
                )
            )
            assert error["code"] == "previous_response_not_found"
            # A stored response resolves from storage on any connection (no cache reuse).
            resumed = final(
                await other.create(model="sim-model", input="c", previous_response_id=stored["id"])
            )
            assert resumed["status"] == "completed"
            # No cache on this connection, yet the prompt begins with the stored response's
            # whole context: cached_tokens counts that shared prefix all the same.
            usage = resumed["usage"]
            assert 0 < usage["input_tokens_details"]["cached_tokens"] < usage["input_tokens"]


async def test_failed_continuation_evicts_the_response_it_referenced(connect: Connect) -> None:
    async with asyncio.timeout(20), connect() as sock:
        first = final(await sock.create(model="sim-model", input="ls", tools=TOOLS, store=False))
        bad = [{"type": "function_call_output", "call_id": "call_wrong", "output": "x"}]
        error = error_of(await answer_tools(sock, first, bad, store=False))
        assert error["param"] == "input[0].call_id"
        # The parent went with the failed continuation: even the right answer cannot use it.
        error = error_of(await answer_tools(sock, first, store=False))
        assert error["code"] == "previous_response_not_found"


async def test_a_second_create_while_one_is_in_flight_waits_its_turn(connect: Connect) -> None:
    async with asyncio.timeout(20), connect() as sock:
        # An append-mode response waiting for tool outputs stays in flight: no timing needed.
        paused = await sock.create(model="sim-model", input="ls", tools=TOOLS, append_mode=True)
        assert paused[-1]["type"] == "response.done"
        response_id = paused[-1]["response"]["id"]
        # Queued behind it on the lane: no event until its turn comes.
        await sock.send({"type": "response.create", "model": "sim-model", "input": "other"})
        await sock.send({"type": "response.cancel", "response_id": response_id})
        ended = await sock.turn()
        assert [e["type"] for e in ended] == ["response.incomplete"]
        assert final(ended)["incomplete_details"] == {"reason": "cancelled"}
        queued = await sock.turn()
        assert queued[0]["type"] == "response.created"
        assert final(queued)["status"] == "completed"
        assert final(queued)["id"] != response_id


async def test_append_keeps_one_long_running_response(connect: Connect) -> None:
    async with asyncio.timeout(20), connect() as sock:
        events = await sock.create(model="sim-model", input="fix it", tools=TOOLS, append_mode=True)
        response_id = events[0]["response"]["id"]
        pauses = 0
        while events[-1]["type"] == "response.done":
            pauses += 1
            done = events[-1]
            assert done["response"]["id"] == response_id
            pending = done["pending_calls"]
            assert pending and all(c["type"] == "function_call" for c in pending)
            if pauses == 1:
                # A wrong call id is refused, and the response keeps waiting.
                await sock.send(
                    {
                        "type": "response.append",
                        "response_id": response_id,
                        "input": [
                            {"type": "function_call_output", "call_id": "call_nope", "output": "x"}
                        ],
                    }
                )
                assert error_of(await sock.turn())["param"] == "input[0].call_id"
            await sock.send(
                {
                    "type": "response.append",
                    "response_id": response_id,
                    "input": [
                        {"type": "function_call_output", "call_id": c["call_id"], "output": "done"}
                        for c in pending
                    ],
                }
            )
            events = await sock.turn()
        assert pauses == 3
        response = final(events)
        assert events[-1]["type"] == "response.completed"
        assert response["id"] == response_id
        assert [i["type"] for i in response["output"]] == ["function_call"] * 3 + ["message"]
        assert [e["type"] for e in events].count("response.created") == 0


async def test_lanes_run_in_parallel_and_echo_their_stream_id(connect: Connect) -> None:
    async with asyncio.timeout(20), connect() as sock:
        for lane in ("a", "b"):
            await sock.send(
                {
                    "type": "response.create",
                    "model": "sim-model",
                    "input": "ls",
                    "tools": TOOLS,
                    "stream_id": lane,
                }
            )
        by_lane: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
        while not all(ev and ev[-1]["type"] in TERMINAL for ev in by_lane.values()):
            event = await sock.recv()
            by_lane[event["stream_id"]].append(event)
        for events in by_lane.values():
            # FIFO per lane: each lane's events arrive in their own order.
            assert [e["sequence_number"] for e in events] == list(range(len(events)))
        # Each lane continues from its own cache.
        firsts = {lane: final(events) for lane, events in by_lane.items()}
        for lane, first in firsts.items():
            events = await answer_tools(sock, first, stream_id=lane)
            assert {e["stream_id"] for e in events} == {lane}
            assert final(events)["usage"]["input_tokens_details"]["cached_tokens"] > 0
        error = error_of(await sock.create(model="sim-model", input="x", stream_id=7))
        assert (error["code"], error["param"]) == ("invalid_type", "stream_id")
        error = error_of(await sock.create(model="sim-model", input="x", stream_id="a b"))
        assert (error["code"], error["param"]) == ("invalid_stream_id", "stream_id")


async def test_generate_false_warms_up_a_chain(connect: Connect) -> None:
    async with asyncio.timeout(20), connect() as sock:
        events = await sock.create(
            model="sim-model",
            generate=False,
            tools=TOOLS,
            input=[{"role": "developer", "content": "base prompt"}],
        )
        assert [e["type"] for e in events] == ["response.created", "response.completed"]
        warm = final(events)
        assert warm["output"] == []
        follow = final(
            await sock.create(
                model="sim-model", tools=TOOLS, input="go", previous_response_id=warm["id"]
            )
        )
        assert follow["status"] == "completed"
        assert (
            follow["usage"]["input_tokens_details"]["cached_tokens"]
            == warm["usage"]["input_tokens"]
        )


@pytest.mark.parametrize(
    ("frame", "code", "param"),
    [
        ("not json", "invalid_json", None),
        (b'{"type": "response.create"}', "invalid_frame", None),
        ("[1, 2]", "invalid_type", None),
        ('{"model": "sim-model"}', "missing_required_parameter", "type"),
        ('{"type": "response.teleport"}', "unknown_event_type", "type"),
        ('{"type": "response.create", "model": 5}', "invalid_type", "model"),
        ('{"type": "response.create", "model": "sim-model", "input": 5}', "invalid_type", "input"),
        (
            '{"type": "response.create", "model": "sim-model", "tools": "x"}',
            "invalid_type",
            "tools",
        ),
        (
            '{"type": "response.create", "model": "sim-model", "store": "yes"}',
            "invalid_type",
            "store",
        ),
    ],
)
async def test_bad_frames_get_an_error_event_and_the_socket_stays_open(
    connect: Connect, frame: str | bytes, code: str, param: str | None
) -> None:
    async with asyncio.timeout(20), connect() as sock:
        await sock.send(frame)
        error = error_of([await sock.recv()])
        assert (error["code"], error["param"]) == (code, param)
        assert final(await sock.create(model="sim-model", input="hi"))["status"] == "completed"


async def test_oversize_frames(server_factory: ServerFactory, tmp_path: Path) -> None:
    config = make_config(tmp_path)
    config.limits.max_message_bytes = 4096
    running: RunningServer = await server_factory(config, http=True)
    assert running.http_port is not None
    connect = connector(running.http_port)
    async with asyncio.timeout(20):
        async with connect() as sock:
            assert final(await sock.create(model="sim-model", input="hi"))["status"] == "completed"
            # Over the limit, the WebSocket layer refuses the frame from its header alone,
            # before buffering it (close 1009).
            await sock.send({"type": "response.create", "model": "sim-model", "input": "x" * 5000})
            with pytest.raises(websockets.ConnectionClosedError) as closed:
                await sock.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
        async with connect() as sock:  # the server is fine
            assert final(await sock.create(model="sim-model", input="hi"))["status"] == "completed"


async def test_age_limit_warns_then_ends_the_connection(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    config = make_config(tmp_path)
    config.limits.connection_max_age_s = 0.6
    config.limits.connection_warning_s = 0.3
    running: RunningServer = await server_factory(config, http=True)
    assert running.http_port is not None
    async with asyncio.timeout(20), connector(running.http_port)() as sock:
        warning = await sock.recv()
        assert warning["type"] == "warning"
        assert warning["code"] == "websocket_connection_limit_approaching"
        error = error_of([await sock.recv()])
        assert error["code"] == "websocket_connection_limit_reached"
        with pytest.raises(websockets.ConnectionClosedOK) as closed:
            await sock.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000


async def test_http_cancel_reaches_a_websocket_response(
    http_server: RunningServer, connect: Connect
) -> None:
    async with (
        asyncio.timeout(20),
        connect() as sock,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_server.http_port}") as http,
    ):
        paused = await sock.create(model="sim-model", input="ls", tools=TOOLS, append_mode=True)
        response_id = paused[-1]["response"]["id"]
        reply = await http.post(f"/v1/responses/{response_id}/cancel")
        assert reply.status_code == 200
        assert reply.json()["status"] == "cancelled"
        ended = await sock.turn()
        assert ended[-1]["type"] == "response.incomplete"


async def test_bearer_token_names_the_tenant(http_server: RunningServer, connect: Connect) -> None:
    # The token's label is charged in the ledger; ``user`` is echoed only when the client
    # sent it.
    async with (
        asyncio.timeout(20),
        connect(
            additional_headers={"Authorization": "Bearer sk-ws", "OpenAI-Beta": "whatever"}
        ) as sock,
    ):
        response = final(await sock.create(model="sim-model", input="hi"))
        assert response["user"] is None
        named = final(await sock.create(model="sim-model", input="hi", user="bob"))
        assert named["user"] == "bob"
        await http_server.core.deps.post.join()
        rows = {r.response_id: r.tenant for r in await http_server.core.deps.store.ledger_rows()}
        assert rows[response["id"]] == tenant_from_authorization("Bearer sk-ws")
        assert rows[named["id"]] == "bob"


async def test_shutdown_lets_the_turn_finish_then_closes(tmp_path: Path) -> None:
    # 200 tokens/s for a 30-token answer: the turn is still running when the stop begins.
    running = await start_server(make_config(tmp_path, tokens_per_second=200), http=True)
    assert running.http_port is not None
    stopping: asyncio.Future[None] | None = None
    try:
        async with asyncio.timeout(20), connector(running.http_port)() as sock:
            await sock.send({"type": "response.create", "model": "sim-model", "input": "hi"})
            assert (await sock.recv())["type"] == "response.created"
            stopping = asyncio.ensure_future(running.stop(grace=10))
            events = await sock.turn()
            assert events[-1]["type"] == "response.completed"
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await sock.recv()
            # 1012 "service restart": the SDK reconnects after it, Codex retries.
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012
    finally:
        await (stopping if stopping is not None else running.stop(grace=0))


async def test_the_socket_is_a_session_of_its_own(
    http_server: RunningServer, connect: Connect
) -> None:
    async with asyncio.timeout(20):
        before = http_server.core.sessions_open
        async with connect() as sock:
            await sock.create(model="sim-model", input="hi")
            assert http_server.core.sessions_open == before + 1
        async with connect() as sock2:
            await sock2.create(model="sim-model", input="hi")
            # The first connection's session was closed when its socket closed.
            assert http_server.core.sessions_open == before + 1


async def test_a_text_frame_of_invalid_utf8_closes_1007_without_an_error_log(
    http_server: RunningServer, connect: Connect, caplog: pytest.LogCaptureFixture
) -> None:
    """A client fault with an expected end: uvicorn logged it as an ERROR with a traceback."""
    caplog.set_level(logging.INFO)
    async with asyncio.timeout(20), connect() as sock:
        sock.ws.protocol.send_frame(Frame(Opcode.TEXT, b'{"type":"\xff\xfe"}'))
        sock.ws.send_data()
        with pytest.raises(websockets.ConnectionClosedError) as closed:
            await sock.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1007
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors
    assert any("invalid UTF-8" in r.getMessage() for r in caplog.records)
    async with asyncio.timeout(20), connect() as sock:  # the server is fine
        assert final(await sock.create(model="sim-model", input="hi"))["status"] == "completed"
