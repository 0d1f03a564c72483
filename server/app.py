"""Running the server: one core, its transports, and a graceful stop.

On SIGTERM or SIGINT the server refuses new responses (``server_shutting_down``), stops
accepting connections and gives in-flight responses a grace period to finish; each stream ends
once its responses have sent their terminal events. Then the core drains its post-inference
queue, so every response that completed has its ledger row and store write (and a response cut
short by the end of the grace period still has its ledger row, with status ``cancelled``).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sqlite3
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from bidi_responses.server.config import ServerConfig
from bidi_responses.server.core.service import ResponsesCore
from bidi_responses.server.transports.grpc_transport import start_grpc_server

log = logging.getLogger("bidi_responses")


@dataclass(slots=True)
class RunningServer:
    """A started server: its core, bound ports, and how to stop it."""

    core: ResponsesCore
    grpc_port: int
    http_port: int | None
    _stops: list[Callable[[float], Awaitable[None]]] = field(default_factory=list)
    _stopped: bool = False

    async def stop(self, grace: float | None = None) -> None:
        """Stop transports (letting in-flight work finish within ``grace``), then drain.

        Idempotent: a second call returns at once.
        """
        if self._stopped:
            return
        self._stopped = True
        grace = self.core.config.grace_period_s if grace is None else grace
        core = self.core
        # From here on new responses are refused (``server_shutting_down``); streams end as
        # soon as their in-flight responses have sent their terminal events.
        core.begin_drain()
        drain = asyncio.ensure_future(core.drain_streams())
        try:
            # The transports share one grace period; after it they cancel what is left.
            await asyncio.gather(*(stop(grace) for stop in self._stops))
        finally:
            if not drain.done():
                drain.cancel()
            await asyncio.gather(drain, return_exceptions=True)
            # Cut-short responses queue their ledger rows, then every queued write lands.
            await core.close()


class StartupError(Exception):
    """The server cannot start: bad configuration, an unusable data directory, a model route
    whose engine cannot be built, a port in use. The message is one line for the operator."""


async def _open_core(config: ServerConfig) -> ResponsesCore:
    try:
        core = ResponsesCore(config)
    except (OSError, sqlite3.Error) as error:
        raise StartupError(
            f"cannot use the data directory '{config.data_dir}' (the store at "
            f"{config.store_path}): {error}"
        ) from error
    try:
        core.router.build_all()
    except (OSError, ValueError) as error:
        await core.store.aclose()
        raise StartupError(f"cannot build the engine of {error}") from error
    return core


async def start_server(config: ServerConfig, *, http: bool = True) -> RunningServer:
    """Start the core, gRPC and (unless ``http`` is False) HTTP+WebSocket.

    Raises StartupError with a one-line reason when something the server needs is unusable.
    """
    core = await _open_core(config)
    await core.start()
    try:
        grpc_server, grpc_port = await start_grpc_server(core, config.host, config.grpc_port)
    except (OSError, RuntimeError) as error:
        await core.close()
        raise StartupError(
            f"cannot serve gRPC on {config.host}:{config.grpc_port}: {error}"
        ) from error
    running = RunningServer(core=core, grpc_port=grpc_port, http_port=None)

    async def stop_grpc(grace: float) -> None:
        await grpc_server.stop(grace)

    running._stops.append(stop_grpc)
    if http:
        from bidi_responses.server.transports.http_transport import start_http_server

        try:
            stop_http, http_port = await start_http_server(
                core, config.host, config.http_port, reuse_port=config.workers > 1
            )
        except OSError as error:
            await running.stop(grace=0)
            raise StartupError(
                f"cannot serve HTTP on {config.host}:{config.http_port}: {error}"
            ) from error
        running.http_port = http_port
        running._stops.insert(0, stop_http)
    return running


def listening_line(config: ServerConfig, grpc_port: int, http_port: int | None) -> str:
    """The one log line that says where the server listens."""
    where = f"gRPC on {config.host}:{grpc_port}"
    if http_port is not None:
        where += f", HTTP+SSE and WebSocket on http://{config.host}:{http_port}/v1"
    workers = f"{config.workers} workers, " if config.workers > 1 else ""
    return f"bidi-responses listening: {where} ({workers}models: {', '.join(config.models)})"


async def serve(
    config: ServerConfig,
    *,
    http: bool = True,
    reload: Callable[[], ServerConfig] | None = None,
    on_ready: Callable[[RunningServer], None] | None = None,
) -> None:
    """Run until SIGTERM/SIGINT, then stop gracefully.

    With ``reload``, SIGHUP re-reads the configuration and applies its model routes: streams
    resolve a changed alias again on their next response (other settings need a restart).
    ``on_ready`` replaces the "listening" log line (a worker process tells its supervisor).
    """
    running = await start_server(config, http=http)
    if on_ready is not None:
        on_ready(running)
    else:
        log.info(listening_line(config, running.grpc_port, running.http_port))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if reload is not None:

        def reload_routes() -> None:
            try:
                changed = running.core.router.update(reload().models)
            except Exception:
                log.exception("SIGHUP: configuration not reloaded")
                return
            log.info(
                "SIGHUP: model routes reloaded; changed: %s (models: %s)",
                ", ".join(changed) or "none",
                ", ".join(running.core.router.aliases),
            )

        loop.add_signal_handler(signal.SIGHUP, reload_routes)
    try:
        await stop.wait()
        log.info("stopping: finishing in-flight responses and draining writes")
    finally:
        await running.stop()
        log.info("stopped")
