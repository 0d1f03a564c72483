"""The served API on each store backend, and what a shared PostgreSQL store adds.

Real servers on loopback, our gRPC client: the stored-response calls behave the same on SQLite
and PostgreSQL; two replicas on one database continue each other's conversations; an
idempotency key makes a retried turn a replay; SIGTERM loses no queued write.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from bidi_responses.bench.ports import free_port
from bidi_responses.client import (
    AsyncResponsesClient,
    FunctionCallItem,
    FunctionCallOutputItem,
    ResponsesError,
)
from bidi_responses.cluster.postgres import TempPostgres
from bidi_responses.server.app import RunningServer

from tests.conftest import SHELL_TOOL, ServerFactory, make_config
from tests.pipeline.server_process import FAST_FLAGS, serve_process
from tests.store.conftest import fresh_database

pytestmark = pytest.mark.timeout(90)


def _output(call: FunctionCallItem, text: str = "ok") -> list[FunctionCallOutputItem]:
    return [{"type": "function_call_output", "call_id": call["call_id"], "output": text}]


async def _start(
    factory: ServerFactory, tmp_path: Path, url: str, name: str = "a", **store: Any
) -> RunningServer:
    config = make_config(tmp_path / name)
    config.store.url = url
    for key, value in store.items():
        setattr(config.store, key, value)
    running: RunningServer = await factory(config)
    return running


async def test_stored_response_api_is_the_same_on_each_backend(
    store_url: str, server_factory: ServerFactory, tmp_path: Path
) -> None:
    async with asyncio.timeout(30):
        server = await _start(server_factory, tmp_path, store_url)
        async with AsyncResponsesClient(f"127.0.0.1:{server.grpc_port}") as client:
            async with client.connect() as stream:
                first = await stream.create(
                    model="sim-model",
                    input=[
                        {"type": "message", "role": "user", "content": f"part {i}"}
                        for i in range(5)
                    ],
                    tools=[SHELL_TOOL],
                )
                second = await stream.create(
                    model="sim-model",
                    previous_response_id=first.id,
                    input=_output(first.function_calls[0]),
                    tools=[SHELL_TOOL],
                )
            assert (await client.get(second.id)).previous_response_id == first.id
            # Cursor paging, newest first by default, then oldest first.
            page = await client.list_input_items(first.id, limit=2)
            assert page["has_more"] and len(page["data"]) == 2
            rest = await client.list_input_items(first.id, limit=10, after=page["last_id"] or "")
            desc = [i["id"] for i in page["data"] + rest["data"]]
            assert not rest["has_more"] and len(desc) == 5
            asc = await client.list_input_items(first.id, limit=10, order="asc")
            assert [i["id"] for i in asc["data"]] == desc[::-1]
            with pytest.raises(ResponsesError) as bad:
                await client.list_input_items(first.id, after="item_nope")
            assert bad.value.param == "after"
            assert await client.delete(first.id)
            with pytest.raises(ResponsesError) as gone:
                await client.get(first.id)
            assert gone.value.code == "not_found"
        await server.core.deps.post.join()
        rows = await server.core.deps.store.ledger_rows()
        assert sorted(r.response_id for r in rows) == sorted([first.id, second.id])


async def test_two_replicas_on_one_database_continue_each_other(
    postgres_server: TempPostgres, server_factory: ServerFactory, tmp_path: Path
) -> None:
    async with asyncio.timeout(30):
        url = await fresh_database(postgres_server)
        a = await _start(server_factory, tmp_path, url, "a")
        b = await _start(server_factory, tmp_path, url, "b")
        assert a.core.deps.ack_after_write and b.core.deps.ack_after_write
        async with (
            AsyncResponsesClient(f"127.0.0.1:{a.grpc_port}") as on_a,
            AsyncResponsesClient(f"127.0.0.1:{b.grpc_port}") as on_b,
        ):
            async with on_a.connect() as stream:
                first = await stream.create(model="sim-model", input="go", tools=[SHELL_TOOL])
            # Acknowledged means written: the other replica continues at once.
            async with on_b.connect() as stream:
                second = await stream.create(
                    model="sim-model",
                    previous_response_id=first.id,
                    input=_output(first.function_calls[0]),
                    tools=[SHELL_TOOL],
                )
            assert second.status == "completed"
            assert (await on_a.get(second.id)).previous_response_id == first.id
        conn = await asyncpg.connect(url)
        try:
            ledger = {r[0] for r in await conn.fetch("SELECT response_id FROM usage_ledger")}
        finally:
            await conn.close()
        assert ledger == {first.id, second.id}


async def test_a_retried_turn_with_its_idempotency_key_is_replayed(
    store_url: str, server_factory: ServerFactory, tmp_path: Path
) -> None:
    async with asyncio.timeout(30):
        server = await _start(server_factory, tmp_path, store_url, ack_after_write=True)
        async with AsyncResponsesClient(f"127.0.0.1:{server.grpc_port}") as client:
            async with client.connect() as stream:
                first = await stream.create(
                    model="sim-model", input="go", tools=[SHELL_TOOL], idempotency_key="turn-0"
                )
            # The same turn again, on a new stream, as after a lost terminal event.
            async with client.connect() as stream:
                again = await stream.create(
                    model="sim-model", input="go", tools=[SHELL_TOOL], idempotency_key="turn-0"
                )
                assert again.id == first.id
                assert again.function_calls == first.function_calls
                # A key reused for another turn of the conversation is refused, named.
                with pytest.raises(ResponsesError) as reused:
                    await stream.create(
                        model="sim-model",
                        previous_response_id=first.id,
                        input=_output(first.function_calls[0]),
                        tools=[SHELL_TOOL],
                        idempotency_key="turn-0",
                    )
                assert reused.value.code == "idempotency_key_reused"
                assert reused.value.param == "idempotency_key"
                with pytest.raises(ResponsesError) as bad:
                    await stream.create(model="sim-model", input="x", idempotency_key="a b")
                assert bad.value.param == "idempotency_key"
            # Another tenant's identical key names another response.
            async with (
                AsyncResponsesClient(f"127.0.0.1:{server.grpc_port}", api_key="k2") as other,
                other.connect() as stream,
            ):
                theirs = await stream.create(
                    model="sim-model", input="go", tools=[SHELL_TOOL], idempotency_key="turn-0"
                )
            assert theirs.id != first.id
            assert (await client.stats())["failover"]["idempotent_replays"] == 1
        rows = await server.core.deps.store.ledger_rows()
        assert sorted(r.response_id for r in rows) == sorted([first.id, theirs.id])


async def _loop(port: int, n: int, turns: int, completed: list[str]) -> None:
    async with AsyncResponsesClient(f"127.0.0.1:{port}") as client, client.connect() as stream:
        response = await stream.create(model="sim-model", input=f"agent {n}", tools=[SHELL_TOOL])
        completed.append(response.id)
        for _ in range(turns):
            response = await stream.create(
                model="sim-model",
                previous_response_id=response.id,
                input=_output(response.function_calls[0], "x" * 2000),
                tools=[SHELL_TOOL],
            )
            completed.append(response.id)


async def test_sigterm_drains_queued_writes_into_postgres(
    postgres_server: TempPostgres, tmp_path: Path
) -> None:
    """The queued (ack before write) path on PostgreSQL: SIGTERM writes every queued job."""
    async with asyncio.timeout(60):
        url = await fresh_database(postgres_server)
        config = tmp_path / "server.toml"
        config.write_text(f'[store]\nurl = "{url}"\nack_after_write = false\n')
        completed: list[str] = []
        args = (*FAST_FLAGS, "--config", str(config))
        async with serve_process(tmp_path / "data", args=args) as (process, port, log):
            await asyncio.gather(*(_loop(port, n, 10, completed) for n in range(6)))
            process.send_signal(signal.SIGTERM)
            assert await process.wait() == 0, str(log)
        conn = await asyncpg.connect(url)
        try:
            ledger = [r[0] for r in await conn.fetch("SELECT response_id FROM usage_ledger")]
            stored = {r[0] for r in await conn.fetch("SELECT id FROM responses")}
        finally:
            await conn.close()
        assert len(completed) == 66
        assert sorted(ledger) == sorted(completed)
        assert stored == set(completed)
        # ``bidi-responses usage --store-url`` reads the same rows.
        usage = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bidi_responses.server.cli", "usage",
            "--store-url", url, "--json",
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await usage.communicate()
        assert json.loads(out)["total"]["responses"] == 66


async def test_serve_names_a_store_it_cannot_reach(tmp_path: Path) -> None:
    """A clear error and exit 2, the URL without its password; no traceback, no hang."""
    async with asyncio.timeout(30):
        port = free_port()  # nothing listens here
        config = tmp_path / "server.toml"
        config.write_text(
            f'[store]\nurl = "postgresql://app:s3cret@127.0.0.1:{port}/db"\n'
            "connect_timeout_s = 0.3\n"
        )
        bad_scheme = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bidi_responses.server.cli", "serve",
            "--store-url", "mysql://x/y", "--data-dir", str(tmp_path),
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await bad_scheme.communicate()
        assert bad_scheme.returncode == 2
        assert b"store.url: unsupported URL 'mysql://...'" in err
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bidi_responses.server.cli", "serve", "--config", str(config),
            "--grpc-port", "0", "--http-port", "0", "--data-dir", str(tmp_path),
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await process.communicate()
        assert process.returncode == 2, err.decode()
        message = err.decode().strip().splitlines()[-1]
        assert message.startswith("error: cannot open the store at postgresql://app:***@127.0.0.1")
        assert "s3cret" not in err.decode()
