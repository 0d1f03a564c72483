"""Property: random interleavings of creates, steers, cancels and disconnects across lanes, on
the real ``Session`` and core with the sim engine, keep the books.

- every response that was created ends exactly once (or, cut by a disconnect, at most once);
- every accepted steer either fails (``response.steer.failed`` with its id) or is committed in
  exactly one response's stored input: its successor's or the explicit continuation's;
  (a disconnect leaves a steer's outcome unknown: at most once, then);
- every response that was created has exactly one ledger row;
- every create is answered: it begins (``response.created``) or an error refuses it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from bidi_responses.server.assembly import HTTP_NAMING, build_core
from bidi_responses.server.core.lanes.session import Session
from bidi_responses.server.core.service import ResponsesCore
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import SHELL_TOOL, make_config, until

pytestmark = pytest.mark.timeout(300)

LANES = ("", "a", "b")
TERMINAL = ("response.completed", "response.incomplete", "response.failed")
Event = dict[str, Any]


@dataclass(frozen=True)
class Create:
    lane: str
    continue_last: bool
    tools: bool


@dataclass(frozen=True)
class Steer:
    target: int  # 0: the latest response created so far, 1: the one before... (none: unknown)


@dataclass(frozen=True)
class Cancel:
    lane: str


@dataclass(frozen=True)
class Yield:
    times: int  # let the server's tasks run this many loop iterations


Op = Create | Steer | Cancel | Yield

ops_strategy = st.lists(
    st.one_of(
        st.builds(Create, st.sampled_from(LANES), st.booleans(), st.booleans()),
        st.builds(Steer, st.integers(0, 3)),
        st.builds(Steer, st.integers(0, 3)),
        st.builds(Cancel, st.sampled_from(LANES)),
        st.builds(Yield, st.integers(1, 40)),
        st.builds(Yield, st.integers(1, 40)),
    ),
    min_size=1,
    max_size=24,
)


@pytest.fixture
async def core(tmp_path: Path) -> AsyncIterator[ResponsesCore]:
    # Paced so that responses are in flight long enough for steers and cancels to land.
    running = build_core(
        make_config(tmp_path, tokens_per_second=1500, answer_tokens=16, tool_rounds=1)
    )
    await running.start()
    try:
        yield running
    finally:
        await running.close()


class Client:
    """Drives one session and records every event it sends."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.events: list[tuple[str, Event]] = []
        self.last: dict[str, str] = {}  # lane -> its last finished response
        self.steers = 0
        self.creates = 0
        self.reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        async for out in self.session.events():
            event = cast(Event, out.data)
            self.events.append((out.lane, event))
            if event["type"] in TERMINAL:
                self.last[out.lane] = event["response"]["id"]

    def created(self) -> list[str]:
        return [e["response"]["id"] for _, e in self.events if e["type"] == "response.created"]

    async def apply(self, op: Op) -> None:
        if isinstance(op, Create):
            body: Event = {
                "type": "response.create",
                "model": "sim-model",
                "input": "go on",
                "store": True,
            }
            if op.lane:
                body["stream_id"] = op.lane
            if op.tools:
                body["tools"] = [SHELL_TOOL]
            if op.continue_last and op.lane in self.last:
                body["previous_response_id"] = self.last[op.lane]
            self.creates += 1
            await self.session.handle(body)
        elif isinstance(op, Steer):
            created = self.created()
            target = created[-1 - op.target % len(created)] if created else "resp_unknown"
            self.steers += 1
            await self.session.handle(
                {
                    "type": "response.steer",
                    "previous_response_id": target,
                    "input": f"steer-{self.steers}",
                }
            )
        elif isinstance(op, Cancel):
            await self.session.handle(
                {"type": "response.cancel", **({"stream_id": op.lane} if op.lane else {})}
            )
        else:
            for _ in range(op.times):
                await asyncio.sleep(0)

    async def settle(self) -> None:
        """Wait until nothing runs or waits, then answer each pending steer's tool calls with
        one explicit continuation, as a client does; until no steer is left pending."""
        answered: set[str] = set()
        while True:
            await until(lambda: self.session.quiet)
            pending = [
                (lane, e)
                for lane, e in self.events
                if e["type"] == "response.steer.pending"
                and e["steer"]["previous_response_id"] not in answered
            ]
            if not pending:
                return
            for lane, event in pending:
                parent = event["steer"]["previous_response_id"]
                if parent in answered:
                    continue
                answered.add(parent)
                body: Event = {
                    "type": "response.create",
                    "model": "sim-model",
                    "store": True,
                    "tools": [SHELL_TOOL],
                    "previous_response_id": parent,
                    "input": [
                        {"type": "function_call_output", "call_id": stub["call_id"], "output": "ok"}
                        for stub in event["required_input"]
                    ],
                }
                if lane:
                    body["stream_id"] = lane
                # Started (or refused) at once: the machine counts it until it ends.
                self.creates += 1
                await self.session.handle(body)


def _is_steering(item: Any) -> bool:
    return bool(
        item.get("type") == "message"
        and item.get("role") == "user"
        and all(part.get("text", "").startswith("steer-") for part in item["content"])
    )


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)
@given(ops=ops_strategy, disconnect=st.sampled_from((False, False, False, True)))
async def test_every_response_ends_once_and_every_steer_is_failed_or_committed_once(
    core: ResponsesCore, ops: list[Op], disconnect: bool
) -> None:
    async with asyncio.timeout(10):
        session = core.open_session(HTTP_NAMING.stream)
        client = Client(session)
        try:
            for op in ops:
                await client.apply(op)
            if not disconnect:
                await client.settle()
                await session.finish()
                await client.reader
        finally:
            await core.close_session(session)
            client.reader.cancel()
        await core.deps.post.join()
        created = client.created()
        rows = Counter(row.response_id for row in await core.deps.store.ledger_rows())
        inputs: dict[str, list[Any]] = {}
        for response_id in created:
            stored = await core.deps.store.get(response_id, None)
            if stored is not None:
                inputs[response_id] = cast(list[Any], stored.input_items)
        stored_inputs = [item for items in inputs.values() for item in items]

    events = [event for _, event in client.events]
    ends = Counter(e["response"]["id"] for e in events if e["type"] in TERMINAL)
    assert len(created) == len(set(created))
    for response_id in created:
        if disconnect:
            assert ends[response_id] <= 1
        else:
            assert ends[response_id] == 1, response_id
        assert rows[response_id] == 1, response_id
    assert set(ends) <= set(created)
    if not disconnect:
        # Every create was answered: it began (response.created), or an error refused it.
        refused = [
            e
            for e in events
            if e["type"] == "error" and e["error"].get("request_type") == "response.create"
        ]
        # (an automatic successor's input is steering messages only)
        successors = [
            rid for rid in created if inputs.get(rid) and all(map(_is_steering, inputs[rid]))
        ]
        assert len(created) - len(successors) + len(refused) == client.creates

    accepted = [e["steer"]["id"] for e in events if e["type"] == "response.steer.accepted"]
    failed = Counter(
        e["steer"]["id"]
        for e in events
        if e["type"] == "response.steer.failed" and "id" in e["steer"]
    )
    pending = Counter(e["steer"]["id"] for e in events if e["type"] == "response.steer.pending")
    assert all(count == 1 for count in pending.values())  # at most once per steer
    texts = Counter(
        part["text"]
        for item in stored_inputs
        if item.get("type") == "message" and item.get("role") == "user"
        for part in item["content"]
        if part.get("type") == "input_text" and part["text"].startswith("steer-")
    )
    accepted_texts = {e["steer"]["id"]: e for e in events if e["type"] == "response.steer.accepted"}
    assert set(failed) <= set(accepted_texts)
    # Which text each accepted steer carried: accepted events come in submission order.
    submitted = [
        f"steer-{n}"
        for n, answer in enumerate(
            (
                e
                for e in events
                if e["type"] in ("response.steer.accepted", "response.steer.failed")
                and (e["type"] == "response.steer.accepted" or "id" not in e["steer"])
            ),
            start=1,
        )
        if answer["type"] == "response.steer.accepted"
    ]
    for steer_id, text in zip(accepted, submitted, strict=True):
        committed = texts[text]
        assert failed[steer_id] <= 1
        if disconnect:
            assert committed + failed[steer_id] <= 1, (steer_id, committed)
        else:
            assert committed + failed[steer_id] == 1, (steer_id, committed, failed[steer_id])
