"""Burst of Connect opens: every stream gets a clear outcome, none a reset without a code.

Starts a server in this process (the sim engine, default limits unless flags say otherwise),
opens ``--opens`` Connect streams at once spread over ``--connections`` HTTP/2 connections,
sends one create on each and tallies how each stream ended: ``response_completed``, a status
code (``RESOURCE_EXHAUSTED`` past a limit), or anything else. Run::

    python -m bidi_responses.bench.mesh_burst --opens 3000 --connections 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections import Counter

import grpc
from bidi_responses.client.aio import ConnectCall
from bidi_responses.codec import params_to_pb
from bidi_responses.server.app import start_server
from bidi_responses.server.engine_config import SimConfig
from bidi_responses.v1 import responses_pb2 as pb
from bidi_responses.v1 import responses_pb2_grpc as pb_grpc

from .servers import sim_server_config


async def burst(
    opens: int,
    connections: int,
    per_connection: int,
    per_tenant: int,
    pending: tuple[int, int] | None = None,
) -> Counter[str]:
    """Open the streams and count outcomes."""
    with tempfile.TemporaryDirectory() as data:
        config = sim_server_config(data, SimConfig(tokens_per_second=100_000))
        config.tenant_limits.max_streams_per_connection = per_connection
        config.tenant_limits.max_streams_per_tenant = per_tenant
        if pending is not None:
            limits = config.tenant_limits
            limits.max_pending_calls, limits.max_pending_calls_hard = pending
        running = await start_server(config, http=False)
        channels = [
            grpc.aio.insecure_channel(
                f"127.0.0.1:{running.grpc_port}", options=[("grpc.use_local_subchannel_pool", 1)]
            )
            for _ in range(connections)
        ]
        outcomes: Counter[str] = Counter()
        calls: list[ConnectCall] = []

        async def one(index: int) -> None:
            stub = pb_grpc.ResponsesServiceStub(channels[index % connections])
            call = stub.Connect()
            calls.append(call)
            outcome = "ended_without_event"
            try:
                create = params_to_pb({"model": "sim-model", "input": "hi"})
                await call.write(pb.ConnectRequest(response_create=create))
                async for message in call:
                    kind = message.WhichOneof("event")
                    if kind in ("response_completed", "error"):
                        outcome = str(kind)
                        break
            except grpc.aio.AioRpcError as error:
                outcome = f"{error.code().name}: {(error.details() or '')[:60]}"
            except Exception as error:  # a write racing the server's status
                outcome = (await call.code()).name if call.done() else type(error).__name__
            outcomes[outcome] += 1

        try:
            await asyncio.gather(*(one(i) for i in range(opens)))
        finally:
            for call in calls:
                call.cancel()
            for channel in channels:
                await channel.close()
            await running.stop(grace=0)
        return outcomes


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--opens", type=int, default=3000)
    parser.add_argument("--connections", type=int, default=30)
    parser.add_argument("--per-connection", type=int, default=100)
    parser.add_argument("--per-tenant", type=int, default=1000)
    parser.add_argument(
        "--grpc-default-pending",
        action="store_true",
        help="gRPC's own pending-call limits (1000 / 3000) instead of the server's",
    )
    args = parser.parse_args()
    started = time.perf_counter()
    pending = (1000, 3000) if args.grpc_default_pending else None
    outcomes = asyncio.run(
        burst(args.opens, args.connections, args.per_connection, args.per_tenant, pending)
    )
    print(
        json.dumps(
            {
                "opens": args.opens,
                "connections": args.connections,
                "per_connection": args.per_connection,
                "per_tenant": args.per_tenant,
                "grpc_default_pending": args.grpc_default_pending,
                "outcomes": dict(outcomes),
                "seconds": round(time.perf_counter() - started, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
