"""Deltas ready together travel as one message; what the client rebuilds is unchanged."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bidi_responses.client import AsyncResponsesClient

from tests.conftest import ServerFactory, make_config


async def _deltas(
    server_factory: ServerFactory, tmp_path: Path, **streaming: object
) -> tuple[int, str, str, int]:
    config = make_config(
        tmp_path / str(len(streaming)) / str(sorted(streaming.items())),
        tokens_per_second=4000,
        answer_tokens=200,
    )
    for key, value in streaming.items():
        setattr(config.streaming, key, value)
    running = await server_factory(config)
    # delta_window_ms=0: the server's window applies (the project client asks for 20 ms).
    client = AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}", delta_window_ms=0)
    async with client, client.connect() as stream:
        events = [e async for e in stream.create_events(model="sim-model", input="talk")]
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    final = events[-1]["response"]
    return (
        len(deltas),
        "".join(deltas),
        final["output"][0]["content"][0]["text"],
        (final["usage"]["output_tokens"]),
    )


async def test_merging_cuts_messages_not_text(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    async with asyncio.timeout(30):
        single, text_single, final_single, tokens = await _deltas(
            server_factory, tmp_path, coalesce_deltas=False
        )
        merged, text_merged, final_merged, _ = await _deltas(
            server_factory, tmp_path, coalesce_deltas=True, delta_window_ms=2.0
        )
    # Without merging, an event per engine hand-over: one token, or the few that fell due while
    # the loop was over a millisecond late (a busy test machine); a 2 ms window at 4,000
    # tokens/s merges about eight.
    assert single > tokens / 2
    assert merged < tokens / 3 and merged < single / 2
    assert text_single == final_single and text_merged == final_merged
    assert final_single == final_merged  # same seed, same text, fewer messages
