"""HTTP continuations from recent state (``server/core/conversation/recent.py``).

A stored response made over HTTP leaves its rendered state in the process; a continuation
naming it (over HTTP or a new stream) starts from that state instead of the stored chain. The
figures must be exactly what a full re-render from the store gives, a state serves one
continuation of its own tenant only, while the store still shows the response, and the cache is
bounded like the stream caches.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from bidi_responses.client import AsyncResponsesClient, ResponsesError
from bidi_responses.server.app import RunningServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import SHELL_TOOL, ServerFactory, make_config

pytestmark = pytest.mark.timeout(300)

Body = dict[str, Any]

READ_TOOL: Body = {
    "type": "function",
    "name": "read_file",
    "description": "Read a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}
TOOL_SETS: tuple[list[Body], ...] = ([SHELL_TOOL], [SHELL_TOOL, READ_TOOL])
INSTRUCTIONS = (None, "Be terse.", "You fix failing tests. " * 30)
MODELS = ("sim-model", "sim-other")


def _client(running: RunningServer, key: str | None = None) -> httpx.AsyncClient:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{running.http_port}", timeout=10, headers=headers
    )


async def _create(http: httpx.AsyncClient, body: Body) -> Body:
    reply = await http.post("/v1/responses", json=body)
    assert reply.status_code == 200, reply.text
    response: Body = reply.json()
    return response


def _answers(response: Body, output: str = "ok") -> list[Body]:
    """A function_call_output for each call the response made."""
    return [
        {"type": "function_call_output", "call_id": item["call_id"], "output": output}
        for item in response["output"]
        if item["type"] == "function_call"
    ]


def _plain(value: Any) -> Any:
    """``value`` without what differs between two runs of one conversation (ids)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k not in ("id", "call_id")}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _figures(response: Body) -> Body:
    """What a continuation must give whichever way its base was found."""
    return {
        "status": response["status"],
        "usage": response["usage"],
        "output": _plain(response["output"]),
        "incomplete_details": response["incomplete_details"],
        "error": response["error"],
        # A conversation's stages carry their state with it, so a continuation from memory,
        # like one on a stream, reports what its new items raise; one rebuilt from the store
        # examines the history again and also reports its flags (``history[i]``) again.
        "safety_flags": [
            flag for flag in response["safety_flags"] if not flag["param"].startswith("history[")
        ],
    }


async def _input_items(http: httpx.AsyncClient, response_id: str) -> list[Any]:
    reply = await http.get(f"/v1/responses/{response_id}/input_items?limit=100&order=asc")
    assert reply.status_code == 200, reply.text
    data: list[Any] = reply.json()["data"]
    return data


@dataclass(frozen=True)
class Turn:
    text: str | None  # a user message after the tool outputs (None: none, if there are any)
    instructions: int
    tools: int
    model: int


_texts = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=300)
turns_strategy = st.lists(
    st.builds(
        Turn,
        text=st.none() | _texts,
        instructions=st.integers(0, len(INSTRUCTIONS) - 1),
        tools=st.integers(0, len(TOOL_SETS) - 1),
        model=st.integers(0, len(MODELS) - 1),
    ),
    min_size=2,
    max_size=7,
)


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[RunningServer, RunningServer]]:
    """Two servers alike but for the recent states: kept (the default) and none (every
    continuation rebuilt and rendered again from the store)."""
    from bidi_responses.server.app import start_server

    kept = make_config(tmp_path / "kept")
    rebuilt = make_config(tmp_path / "rebuilt")
    rebuilt.cache.recent_max_responses = 0
    servers = [await start_server(kept, http=True), await start_server(rebuilt, http=True)]
    try:
        yield servers[0], servers[1]
    finally:
        for running in servers:
            await running.stop(grace=0)


async def _conversation(http: httpx.AsyncClient, turns: list[Turn]) -> tuple[list[Body], Body]:
    """The responses of ``turns`` until one is refused, and that refusal (empty: none)."""
    responses: list[Body] = []
    for turn in turns:
        new_input: list[Body] = _answers(responses[-1]) if responses else []
        if turn.text is not None or not new_input:
            text = turn.text if turn.text is not None else "Go on."
            new_input.append({"role": "user", "content": text})
        body: Body = {
            "model": MODELS[turn.model],
            "tools": TOOL_SETS[turn.tools],
            "input": new_input,
        }
        if INSTRUCTIONS[turn.instructions] is not None:
            body["instructions"] = INSTRUCTIONS[turn.instructions]
        if responses:
            body["previous_response_id"] = responses[-1]["id"]
        reply = await http.post("/v1/responses", json=body)
        if reply.status_code != 200:
            return responses, {"status": reply.status_code, **reply.json()}
        responses.append(reply.json())
    return responses, {}


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)
@given(turns=turns_strategy)
async def test_a_continuation_from_memory_gives_what_a_full_rerender_gives(
    pair: tuple[RunningServer, RunningServer], turns: list[Turn]
) -> None:
    kept, rebuilt = pair
    async with asyncio.timeout(60), _client(kept) as fast, _client(rebuilt) as slow:
        from_memory, refused = await _conversation(fast, turns)
        from_store, refused_too = await _conversation(slow, turns)
        # A continuation the rebuild refuses (a function of the history no longer declared)
        # is refused from memory too, with the same error.
        assert refused == refused_too
        for i, (a, b) in enumerate(zip(from_memory, from_store, strict=True)):
            # Same output, usage (cached_tokens included) and flags, turn by turn.
            assert _figures(a) == _figures(b), f"turn {i + 1}"
            if i:
                # ... though only the memory's side skipped the history.
                new_items = a["stats"]["items_validated"]
                assert new_items < b["stats"]["items_validated"], f"turn {i + 1}"
                assert new_items == len(_answers(from_memory[i - 1])) + (
                    turns[i].text is not None or not _answers(from_memory[i - 1])
                )
        # The store keeps the same items either way.
        for a, b in zip(from_memory, from_store, strict=True):
            assert _plain(await _input_items(fast, a["id"])) == _plain(
                await _input_items(slow, b["id"])
            )


async def test_a_new_stream_continues_an_http_response_from_memory(
    server_factory: ServerFactory,
) -> None:
    async with asyncio.timeout(30):
        running: RunningServer = await server_factory(http=True)
        async with _client(running) as http:
            first = await _create(
                http, {"model": "sim-model", "input": "list the files", "tools": [SHELL_TOOL]}
            )
            second = await _create(
                http,
                {
                    "model": "sim-model",
                    "previous_response_id": first["id"],
                    "tools": [SHELL_TOOL],
                    "input": _answers(first),
                },
            )
            body: Body = {
                "model": "sim-model",
                "previous_response_id": second["id"],
                "tools": [SHELL_TOOL],
                "input": _answers(second),
            }
            counted = await http.post("/v1/responses/input_tokens", json=body)
            assert counted.status_code == 200, counted.text
        client = AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}")
        async with client, client.connect() as stream:
            third = await stream.create(**body)
    assert third.status == "completed" and third.usage is not None
    # Only the new tool output was checked and rendered: the state came from memory.
    assert third.stats["items_validated"] == 1
    assert third.usage.input_tokens == counted.json()["input_tokens"]
    assert second["usage"]["input_tokens"] < third.usage.cached_tokens < third.usage.input_tokens


async def test_a_state_serves_its_own_tenant_only(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    config = make_config(tmp_path)
    config.auth.api_keys = {"key-a": "tenant-a", "key-b": "tenant-b"}
    async with asyncio.timeout(30):
        running: RunningServer = await server_factory(config, http=True)
        async with _client(running, "key-a") as a, _client(running, "key-b") as b:
            first = await _create(
                a, {"model": "sim-model", "input": "list the files", "tools": [SHELL_TOOL]}
            )
            body: Body = {
                "model": "sim-model",
                "previous_response_id": first["id"],
                "tools": [SHELL_TOOL],
                "input": _answers(first),
            }
            refused = await b.post("/v1/responses", json=body)
            assert refused.status_code == 400
            assert refused.json()["error"]["code"] == "previous_response_not_found"
            # The other tenant's attempt neither took nor spoiled the owner's state.
            second = await _create(a, body)
    assert second["status"] == "completed"
    assert second["stats"]["items_validated"] == 1


async def test_a_deleted_response_is_not_continued_from_memory(
    server_factory: ServerFactory,
) -> None:
    async with asyncio.timeout(30):
        running: RunningServer = await server_factory(http=True)
        async with _client(running) as http:
            kept = await _create(http, {"model": "sim-model", "input": "keep this one"})
            deleted = await _create(http, {"model": "sim-model", "input": "delete this one"})
            assert (await http.delete(f"/v1/responses/{deleted['id']}")).status_code == 200
            for response in (deleted, kept):
                reply = await http.post(
                    "/v1/responses",
                    json={
                        "model": "sim-model",
                        "previous_response_id": response["id"],
                        "input": "and then?",
                    },
                )
                if response is deleted:
                    assert reply.status_code == 400
                    assert reply.json()["error"]["code"] == "previous_response_not_found"
                else:  # the same server continues a response it still has from memory
                    assert reply.status_code == 200
                    assert reply.json()["stats"]["items_validated"] == 1


async def test_an_unstored_response_stays_on_its_own_connection(
    server_factory: ServerFactory,
) -> None:
    async with asyncio.timeout(30):
        running: RunningServer = await server_factory(http=True)
        async with _client(running) as http:
            unstored = await _create(
                http, {"model": "sim-model", "input": "private", "store": False}
            )
            body: Body = {
                "model": "sim-model",
                "previous_response_id": unstored["id"],
                "input": "and then?",
            }
            reply = await http.post("/v1/responses", json=body)
            assert reply.status_code == 400
            assert reply.json()["error"]["code"] == "previous_response_not_found"
        client = AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}")
        async with client, client.connect() as stream:
            with pytest.raises(ResponsesError) as caught:
                await stream.create(
                    model="sim-model", previous_response_id=unstored["id"], input="and?"
                )
    assert caught.value.code == "previous_response_not_found"


async def test_two_continuations_of_one_response_at_once_each_get_their_own_conversation(
    server_factory: ServerFactory,
) -> None:
    async with asyncio.timeout(30):
        running: RunningServer = await server_factory(http=True, tool_rounds=10)
        async with _client(running) as http:
            first = await _create(
                http, {"model": "sim-model", "input": "list the files", "tools": [SHELL_TOOL]}
            )

            def branch(output: str) -> Body:
                return {
                    "model": "sim-model",
                    "previous_response_id": first["id"],
                    "tools": [SHELL_TOOL],
                    "input": _answers(first, output),
                }

            left, right = await asyncio.gather(
                _create(http, branch("left " * 50)), _create(http, branch("right " * 50))
            )
            # One took the state, the other rebuilt from the store: the same figures.
            validated = {left["stats"]["items_validated"], right["stats"]["items_validated"]}
            assert min(validated) == 1
            assert left["usage"] == right["usage"]
            # Each branch goes on from memory with its own history only: the prompt is what
            # its stored chain renders to (a state shared by the two would hold both).
            for response in (left, right):
                follow: Body = {
                    "model": "sim-model",
                    "previous_response_id": response["id"],
                    "tools": [SHELL_TOOL],
                    "input": _answers(response),
                }
                counted = await http.post("/v1/responses/input_tokens", json=follow)
                assert counted.status_code == 200, counted.text
                nxt = await _create(http, follow)
                assert nxt["stats"]["items_validated"] == 1  # from memory
                assert nxt["usage"]["input_tokens"] == counted.json()["input_tokens"]


async def test_recent_states_are_bounded_by_count_and_by_the_global_budget(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    config = make_config(tmp_path)
    config.cache.recent_max_responses = 2
    async with asyncio.timeout(30):
        running: RunningServer = await server_factory(config, http=True)
        recent = running.core.deps.recent
        budget = running.core.deps.cache_budget
        async with _client(running) as http:
            made = [
                await _create(http, {"model": "sim-model", "input": f"conversation {i}"})
                for i in range(4)
            ]
            assert len(recent) == 2 and budget.used == recent.bytes_used
            # The budget over every cache evicts them too, least recently kept first: one and
            # a half states' worth keeps one.
            sizes = [state.approx_bytes() for _, state in recent.entries()]
            budget.max_bytes = max(sizes) * 3 // 2
            big = await _create(http, {"model": "sim-model", "input": "conversation 9"})
            assert len(recent) == 1 and big["id"] in recent and budget.used <= budget.max_bytes

            async def go_on(response: Body) -> Body:
                return await _create(
                    http,
                    {
                        "model": "sim-model",
                        "previous_response_id": response["id"],
                        "input": "and then?",
                    },
                )

            # An evicted state is rebuilt from the store, with the same figures.
            from_memory = await go_on(big)
            evicted = await go_on(made[0])
            assert evicted["stats"]["items_validated"] == 3
            assert from_memory["stats"]["items_validated"] == 1
            again = await go_on(made[0])
            assert again["usage"] == evicted["usage"]
