"""SIGTERM under many Connect streams: every stream ends UNAVAILABLE, and the drain logs no
ERROR and no traceback.

The server runs as users run it, a ``bidi-responses serve`` subprocess. Stock grpcio clients
open N Connect streams: a third idle after one turn, a third with a response that finishes
within the grace period, a third with one that does not. Then SIGTERM. Each stream must end
with status UNAVAILABLE (``server_shutting_down``), never INTERNAL ("Internal error from
Core") or OK, and the server's log must hold no ERROR line and no traceback (a drained
stream used to log ``AbortError: Locally aborted`` from its reader, one per stream).

The smoke version (10 streams) runs in ``make test``; ``make faults`` runs 100 and prints the
figures.
"""

from __future__ import annotations

import asyncio
import collections
import signal
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from bidi_responses.codec import params_to_pb
from bidi_responses.v1 import responses_pb2 as pb
from bidi_responses.v1 import responses_pb2_grpc as pb_grpc

from tests.pipeline.server_process import serve_process

# 20 tokens/s: a 16-token answer ends within the grace period, the default 200-token one
# (10 s) does not.
ARGS = ("--sim-tps", "20", "--sim-ttft-ms", "0", "--sim-tool-rounds", "0", "--grace-period-s")
GRACE_S = "2"
TERMINAL = ("response_completed", "response_incomplete", "response_failed", "error")


@dataclass
class DrainRun:
    """What every stream ended with, and what the server logged."""

    statuses: collections.Counter[str] = field(default_factory=collections.Counter)
    details: collections.Counter[str] = field(default_factory=collections.Counter)
    error_lines: list[str] = field(default_factory=list)
    tracebacks: int = 0
    exit_code: int | None = None

    def read_log(self, text: str) -> None:
        """Note the server log's ERROR lines and tracebacks."""
        lines = text.splitlines()
        self.error_lines = [line for line in lines if " ERROR " in line or " CRITICAL " in line]
        self.tracebacks = sum("Traceback" in line for line in lines)

    def table(self) -> str:
        return (
            f"streams: {sum(self.statuses.values())}; statuses: {dict(self.statuses)}; "
            f"ERROR lines: {len(self.error_lines)}; tracebacks: {self.tracebacks}; "
            f"exit code: {self.exit_code}; details: {dict(self.details)}"
        )


async def _stream(
    stub: pb_grpc.ResponsesServiceAsyncStub,
    kind: int,
    ready: asyncio.Semaphore,
    run: DrainRun,
) -> None:
    """One Connect stream: a turn, then (kind 1, 2) a response left in flight; reads until
    the stream ends and records its status."""
    call = stub.Connect()
    first = {"model": "sim-model", "input": "hi", "store": False, "max_output_tokens": 16}
    released = False
    try:
        await call.write(pb.ConnectRequest(response_create=params_to_pb(first)))
        while (message := await call.read()) != grpc.aio.EOF:
            assert isinstance(message, pb.ConnectResponse)
            if message.WhichOneof("event") in TERMINAL:
                break
        if kind:
            body = {**first, "max_output_tokens": 16 if kind == 1 else None}
            await call.write(pb.ConnectRequest(response_create=params_to_pb(body)))
        ready.release()
        released = True
        while (message := await call.read()) != grpc.aio.EOF:
            pass
        run.statuses["OK"] += 1
    except grpc.aio.AioRpcError as error:
        run.statuses[error.code().name] += 1
        run.details[error.details() or ""] += 1
    finally:
        if not released:
            ready.release()  # it ended before the SIGTERM: counted, and not waited for


async def drain_under_streams(streams: int, tmp_path: Path) -> DrainRun:
    """Open ``streams`` Connect streams, SIGTERM the server, and tally the ends."""
    run = DrainRun()
    async with serve_process(tmp_path / "data", args=(*ARGS, GRACE_S)) as (process, port, log):
        # One connection: at most the server's 100 streams per connection.
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.ResponsesServiceStub(channel)
            ready = asyncio.Semaphore(0)
            tasks = [
                asyncio.ensure_future(_stream(stub, n % 3, ready, run)) for n in range(streams)
            ]
            for _ in range(streams):  # every stream has had its first turn (or has ended)
                await ready.acquire()
            process.send_signal(signal.SIGTERM)
            await asyncio.gather(*tasks)
        run.exit_code = await process.wait()
        await log.close()
    run.read_log(str(log))
    return run


def _check(run: DrainRun, streams: int) -> None:
    assert run.statuses == {"UNAVAILABLE": streams}, (run.table(), run.details)
    _check_clean_exit(run)


def _check_clean_exit(run: DrainRun) -> None:
    assert not run.error_lines and run.tracebacks == 0, (run.table(), run.error_lines[:5])
    assert run.exit_code == 0, run.table()


async def test_sigterm_drain_smoke(tmp_path: Path) -> None:
    async with asyncio.timeout(90):
        run = await drain_under_streams(10, tmp_path)
    _check(run, 10)


@pytest.mark.slow
@pytest.mark.faults
async def test_sigterm_drain_under_100_streams(tmp_path: Path) -> None:
    async with asyncio.timeout(300):
        run = await drain_under_streams(100, tmp_path)
    print(f"\nSIGTERM under 100 Connect streams: {run.table()}")
    _check(run, 100)


async def test_sigterm_ends_stateless_calls_past_the_grace_period_unavailable(
    tmp_path: Path,
) -> None:
    """A ``CreateResponse`` still running when the grace period ends: UNAVAILABLE with the
    server's status, never OK without its terminal event."""
    async with (
        asyncio.timeout(60),
        serve_process(tmp_path / "data", args=(*ARGS, GRACE_S)) as (process, port, log),
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        stub = pb_grpc.ResponsesServiceStub(channel)
        body = {"model": "sim-model", "input": "a long answer", "store": False}
        calls = [
            stub.CreateResponse(pb.CreateResponseRequest(params=params_to_pb(body)))
            for _ in range(3)
        ]
        for call in calls:  # each has started (response.created)
            assert isinstance(await call.read(), pb.CreateResponseResponse)
        process.send_signal(signal.SIGTERM)
        for call in calls:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                while (message := await call.read()) != grpc.aio.EOF:
                    assert isinstance(message, pb.CreateResponseResponse)
                    event = message.event.WhichOneof("event")
                    assert event not in TERMINAL, event
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "shutting down" in (caught.value.details() or "")
        assert await process.wait() == 0
    assert " ERROR " not in str(log)


async def _cancelled_around_the_abort(
    stub: pb_grpc.ResponsesServiceAsyncStub,
    ready: asyncio.Semaphore,
    cancel_after_s: float,
    signalled: asyncio.Event,
    run: DrainRun,
) -> None:
    """A stream whose response outlasts the grace period, cancelled by its client close to
    the moment the server aborts it (the drain's abort racing the client's cancel)."""
    call = stub.Connect()
    body = {"model": "sim-model", "input": "a long answer", "store": False}
    await call.write(pb.ConnectRequest(response_create=params_to_pb(body)))
    message = await call.read()
    assert isinstance(message, pb.ConnectResponse)
    ready.release()
    await signalled.wait()
    # A fault schedule, not a synchronization: the cancels are spread around the grace end.
    await asyncio.sleep(cancel_after_s)
    call.cancel()
    run.statuses[(await call.code()).name] += 1


async def drain_while_clients_cancel(streams: int, tmp_path: Path) -> DrainRun:
    """SIGTERM with ``streams`` long responses in flight whose clients cancel around the end
    of the grace period; what the server logged."""
    run = DrainRun()
    grace = float(GRACE_S)
    async with serve_process(tmp_path / "data", args=(*ARGS, GRACE_S)) as (process, port, log):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.ResponsesServiceStub(channel)
            ready, signalled = asyncio.Semaphore(0), asyncio.Event()
            offsets = [grace - 0.1 + 0.3 * n / streams for n in range(streams)]
            tasks = [
                asyncio.ensure_future(
                    _cancelled_around_the_abort(stub, ready, offset, signalled, run)
                )
                for offset in offsets
            ]
            for _ in range(streams):
                await ready.acquire()
            process.send_signal(signal.SIGTERM)
            signalled.set()
            await asyncio.gather(*tasks)
        run.exit_code = await process.wait()
        await log.close()
    run.read_log(str(log))
    return run


def _check_quiet(run: DrainRun, streams: int) -> None:
    assert sum(run.statuses.values()) == streams, run.table()
    assert set(run.statuses) <= {"UNAVAILABLE", "CANCELLED"}, run.table()
    _check_clean_exit(run)


async def test_sigterm_while_clients_cancel_logs_no_error_smoke(tmp_path: Path) -> None:
    # 100 streams: with fewer the race is rarely met (at 100 it logged on every run before).
    async with asyncio.timeout(90):
        run = await drain_while_clients_cancel(100, tmp_path)
    _check_quiet(run, 100)


@pytest.mark.slow
@pytest.mark.faults
async def test_sigterm_while_clients_cancel_logs_no_error_five_times(tmp_path: Path) -> None:
    for round in range(5):
        async with asyncio.timeout(120):
            run = await drain_while_clients_cancel(100, tmp_path / str(round))
        print(f"\nSIGTERM while 100 Connect clients cancel, round {round + 1}: {run.table()}")
        _check_quiet(run, 100)
