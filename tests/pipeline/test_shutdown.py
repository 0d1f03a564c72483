"""SIGTERM under load, then a restart: the ledger and the store lost nothing, doubled nothing.

The server runs as users run it, a ``bidi-responses serve`` subprocess. Sixteen agents loop over
Connect streams with stored responses; after enough completions the test sends SIGTERM while
responses are still completing. Every response whose ``response.completed`` reached a client
must then have exactly one ledger row, and be retrievable from the store after a restart.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import sys
from pathlib import Path
from typing import Any

from bidi_responses.client import AsyncResponsesClient

from tests.conftest import SHELL_TOOL
from tests.pipeline.server_process import serve_process
from tests.workload import tool_output

AGENTS = 16
TURNS = 12
SIGTERM_AFTER = 48


async def _agent(
    port: int, n: int, completed: list[str], errors: list[str], threshold: asyncio.Event
) -> bool:
    """One agent loop; True if it ran all its turns, False if the server stopped it."""
    async with AsyncResponsesClient(f"127.0.0.1:{port}") as client, client.connect() as stream:
        try:
            response = await stream.create(
                model="sim-model",
                input=f"agent {n}: fix it",
                tools=[SHELL_TOOL],
                user=f"tenant-{n % 4}",
            )
            for turn in range(TURNS):
                assert response.status == "completed"
                completed.append(response.id)
                if len(completed) >= SIGTERM_AFTER:
                    threshold.set()
                call = response.function_calls[0]
                response = await stream.create(
                    model="sim-model",
                    previous_response_id=response.id,
                    tools=[SHELL_TOOL],
                    user=f"tenant-{n % 4}",
                    input=[
                        {
                            "type": "function_call_output",
                            "call_id": call["call_id"],
                            "output": tool_output(400, seed=n * 100 + turn),
                        }
                    ],
                )
            completed.append(response.id)
        except Exception as error:  # the server refused new work or ended the stream
            errors.append(getattr(error, "message", None) or type(error).__name__)
            return False
    return True


async def test_sigterm_under_load_loses_and_doubles_nothing(tmp_path: Path) -> None:
    async with asyncio.timeout(90):
        data = tmp_path / "data"
        completed: list[str] = []
        errors: list[str] = []
        threshold = asyncio.Event()
        async with serve_process(data) as (process, port, log):
            agents = [
                asyncio.ensure_future(_agent(port, n, completed, errors, threshold))
                for n in range(AGENTS)
            ]
            await threshold.wait()
            at_signal = len(completed)
            process.send_signal(signal.SIGTERM)
            finished = await asyncio.gather(*agents)
            assert await process.wait() == 0, str(log)
        # Responses were still completing when the signal arrived, and some agents were
        # refused further work.
        assert at_signal < len(completed) < AGENTS * (TURNS + 1)
        # (Refused with ``server_shutting_down``, or, once its stream ended, failed in the
        # client library with whatever it reports for a finished call.)
        assert errors and len(errors) == finished.count(False)
        assert len(set(completed)) == len(completed)

        # The ledger, read directly: one row per completed response, and nothing else.
        db = data / "responses.db"
        with sqlite3.connect(db) as conn:
            ledger = conn.execute("SELECT response_id, status FROM usage_ledger").fetchall()
            stored = {row[0] for row in conn.execute("SELECT id FROM responses")}
        ids = [row[0] for row in ledger]
        assert len(ids) == len(set(ids))
        assert set(ids) == set(completed)
        assert {status for _, status in ledger} == {"completed"}
        assert stored == set(completed)
        assert not (data / "post-failed.jsonl").exists()

        # Restart on the same data: every stored response is served; the usage summary agrees.
        async with serve_process(data) as (process, port, log):
            async with AsyncResponsesClient(f"127.0.0.1:{port}") as client:
                fetched = await asyncio.gather(*(client.get(i) for i in completed))
                assert [r.id for r in fetched] == completed
                assert {r.status for r in fetched} == {"completed"}
            usage = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bidi_responses.server.cli",
                "usage",
                "--data-dir",
                str(data),
                "--by",
                "tenant",
                "--json",
                stdout=asyncio.subprocess.PIPE,
            )
            out, _ = await usage.communicate()
            summary: dict[str, Any] = json.loads(out)
            assert summary["total"]["responses"] == len(completed)
            assert [g["tenant"] for g in summary["groups"]] == [f"tenant-{i}" for i in range(4)]
            process.send_signal(signal.SIGTERM)
            assert await process.wait() == 0
