"""The server side of the post-inference benchmark: one child process per mode.

Each mode is the shipped server with its post-inference path changed as the mode says (see
``post_inference``); the process prints ``listening <port>`` once it serves, and on SIGTERM
drains its queue and prints how many jobs it wrote.
"""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass

__all__ = ["MODES", "Settings", "serve"]

MODES = ("queued", "unjournaled", "journal-nosync", "queued-slow", "no-writes", "inline-slow")


@dataclass(frozen=True, slots=True)
class Settings:
    """One benchmark run's knobs (the same for every mode)."""

    turns: int = 25
    repeats: int = 3
    store_ms: float = 20.0
    tool_output_tokens: int = 4000
    tokens_per_second: float = 1000.0
    ttft_ms: float = 0.0
    prefill_tokens_per_second: float = 1e9
    seed: int = 0


async def serve(mode: str, data_dir: str, store_ms: float, settings: Settings) -> None:
    from bidi_responses.server.app import start_server
    from bidi_responses.server.core.lanes.session import Session
    from bidi_responses.server.core.storage.postinference import PostJob
    from bidi_responses.server.core.storage.store import WriteJob
    from bidi_responses.server.engine_config import SimConfig

    from .servers import sim_server_config

    sim = SimConfig(
        tokens_per_second=settings.tokens_per_second,
        ttft_ms=settings.ttft_ms,
        prefill_tokens_per_second=settings.prefill_tokens_per_second,
        tool_rounds=settings.turns + 10,
        seed=settings.seed,
    )
    config = sim_server_config(data_dir, sim)
    config.durability.journal = mode != "unjournaled"
    config.durability.fsync = mode != "journal-nosync"
    running = await start_server(config, http=False)
    core = running.core
    store = core.deps.store
    real_write = store.write_many

    async def slow_write(jobs: list[WriteJob]) -> None:
        await asyncio.sleep(store_ms / 1000)  # a slow disk: latency, not event-loop work
        await real_write(jobs)

    async def no_write(jobs: list[WriteJob]) -> None:
        return None

    # In line: the job is kept, the terminal event goes out, and the connection's next request
    # is handled only after the kept jobs are written.
    kept: list[PostJob] = []

    async def keep(job: PostJob) -> None:
        if job.record is not None:
            store.stage(job.record.response["id"], job.record)
        kept.append(job)

    real_handle = Session.handle

    async def handle_after_writes(
        self: Session, event: object, received: float | None = None
    ) -> None:
        while kept:
            job = kept.pop(0)
            await slow_write([(job.record, job.ledger)])
        await real_handle(self, event, received)

    if mode == "queued-slow":
        store.write_many = slow_write  # type: ignore[method-assign]
    elif mode == "no-writes":
        store.write_many = no_write  # type: ignore[method-assign]
    elif mode == "inline-slow":
        core.deps.post.put = keep  # type: ignore[method-assign]
        Session.handle = handle_after_writes  # type: ignore[method-assign]
    elif mode not in ("queued", "unjournaled", "journal-nosync"):
        raise SystemExit(f"unknown mode {mode}")
    print(f"listening {running.grpc_port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await running.stop()  # drains the queue
    written = core.deps.post.written if mode != "inline-slow" else -1
    print(f"written {written} failed {core.deps.post.failed}", flush=True)
