"""Running the server: one core, its transports, and a graceful stop.

On SIGTERM or SIGINT the server first reports NOT_SERVING (grpc.health.v1 and ``/readyz``) and
refuses new streams and requests (UNAVAILABLE / 503 ``server_shutting_down``); after
``drain_notice_s`` (time for load balancers to notice) open streams get a ``warning``, their
in-flight responses get the grace period to finish, and each stream then ends with UNAVAILABLE
(WebSocket close 1012). Only then do the listeners close. Then the core drains its post-inference
queue, so every response that completed has its ledger row and store write (and a response cut
short by the end of the grace period still has its ledger row, with status ``cancelled``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sqlite3
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from .assembly import GRPC_NAMING, HTTP_NAMING, build_core, transport_port
from .config import ServerConfig
from .core.observability import CLIENT_FAULTS, freeze_startup_heap
from .core.service import ResponsesCore
from .core.tenancy import ApiKeys
from .transports.connections import raise_descriptor_limit
from .transports.grpc import GrpcServer, start_grpc_server

log = logging.getLogger("bidi_responses")

# After the drain, how long unary calls and health watchers get before the gRPC listener stops.
_GRPC_TAIL_S = 1.0


@dataclass(slots=True)
class RunningServer:
    """A started server: its core, bound ports, and how to stop it."""

    core: ResponsesCore
    grpc_port: int
    http_port: int | None
    grpc: GrpcServer | None = None
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
        # Health flips first, while the listeners are still open: probes and load balancers
        # see NOT_SERVING (the core's drain hooks), and new streams and requests get
        # UNAVAILABLE / 503 ``server_shutting_down``.
        core.begin_drain()
        notice = core.config.drain_notice_s
        if notice > 0 and grace > 0:
            await asyncio.sleep(min(notice, grace))  # a deliberate pause, not synchronisation
        # Streams end as soon as their in-flight responses have sent their terminal events.
        drain = asyncio.ensure_future(core.drain_streams())

        async def stop_grpc() -> None:
            if self.grpc is None:
                return
            # Once every stream and stateless call has ended, only quick unary calls and
            # health Watch streams are left: they get a short tail, not the whole grace.
            loop = asyncio.get_running_loop()
            deadline = loop.time() + grace
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await asyncio.shield(drain)
            if not drain.done():
                # The grace period is over: the streams still open end with their own status
                # (UNAVAILABLE, ``server_shutting_down``), not as the listener's cancellation.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_GRPC_TAIL_S):
                        await core.cut_streams()
                        await core.wait_until_idle()
            await self.grpc.server.stop(max(min(deadline - loop.time(), _GRPC_TAIL_S), 0))

        try:
            # The transports share one grace period; after it they cancel what is left.
            await asyncio.gather(stop_grpc(), *(stop(grace) for stop in self._stops))
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
        core = build_core(config)
    except (OSError, sqlite3.Error) as error:
        raise StartupError(
            f"cannot use the data directory '{config.data_dir}' (the store at "
            f"{config.store_path}): {error}"
        ) from error
    try:
        core.deps.router.build_all()
    except (OSError, ValueError) as error:
        await core.deps.store.aclose()
        raise StartupError(f"cannot build the engine of {error}") from error
    return core


async def start_server(config: ServerConfig, *, http: bool = True) -> RunningServer:
    """Start the core, gRPC and (unless ``http`` is False) HTTP+WebSocket.

    Raises StartupError with a one-line reason when something the server needs is unusable.
    """
    # Every connection is a descriptor: take all the process may have, then bound each
    # listener below it (transports/connections.py).
    raise_descriptor_limit()
    CLIENT_FAULTS.configure(config.limits.client_fault_log_lines_per_minute)
    core = await _open_core(config)
    await core.start()
    try:
        grpc_server = await start_grpc_server(
            transport_port(core, GRPC_NAMING), config, config.host, config.grpc_port
        )
    except (OSError, RuntimeError) as error:
        await core.close()
        raise StartupError(
            f"cannot serve gRPC on {config.host}:{config.grpc_port}: {error}"
        ) from error
    running = RunningServer(core=core, grpc_port=grpc_server.port, http_port=None, grpc=grpc_server)

    if http:
        from .transports.http import start_http_server

        try:
            stop_http, http_port = await start_http_server(
                transport_port(core, HTTP_NAMING),
                config,
                config.host,
                config.http_port,
                reuse_port=config.workers > 1,
            )
        except OSError as error:
            await running.stop(grace=0)
            raise StartupError(
                f"cannot serve HTTP on {config.host}:{config.http_port}: {error}"
            ) from error
        running.http_port = http_port
        running._stops.insert(0, stop_http)
    return running


def listening_line(
    config: ServerConfig, grpc_port: int, http_port: int | None, guard: str = ""
) -> str:
    """The one log line that says where the server listens, and how it is secured."""
    tls = config.tls
    scheme = "https" if tls.enabled else "http"
    where = f"gRPC on {config.host}:{grpc_port}"
    if http_port is not None:
        where += f", HTTP+SSE and WebSocket on {scheme}://{config.host}:{http_port}/v1"
    workers = f"{config.workers} workers, " if config.workers > 1 else ""
    security = ("mTLS" if tls.client_ca_file else "TLS") if tls.enabled else "plaintext"
    security += ", API keys" if not _open_server(config) else ", no API keys"
    return (
        f"bidi-responses listening: {where} "
        f"({workers}{security}{guard}; models: {', '.join(config.models)})"
    )


_LOOPBACK = ("127.0.0.1", "::1", "localhost")


def guard_public_bind(config: ServerConfig) -> tuple[ServerConfig, str]:
    """Without API keys, bind loopback only unless told otherwise; returns what to say."""
    auth = config.auth
    if not _open_server(config):
        return config, ""
    if config.host in _LOOPBACK or config.host.startswith("127."):
        return config, "; loopback only because no API keys are configured"
    if auth.allow_unauthenticated_public:
        return config, f"; WARNING: {config.host} is open to anyone, no API keys"
    log.warning(
        "no API keys are configured: binding 127.0.0.1 instead of %s "
        "(configure keys, or pass --allow-unauthenticated-public)",
        config.host,
    )
    config.host = "127.0.0.1"
    return config, "; loopback only because no API keys are configured"


def _open_server(config: ServerConfig) -> bool:
    """True when no API key is configured (from any source). A keys file or variable that
    holds no key leaves the server open, so it is judged by the keys it holds, not by being
    set; one that cannot be read is reported when the core loads it."""
    auth = config.auth
    try:
        keys = ApiKeys.load(auth.api_keys, auth.api_keys_file, auth.api_keys_env)
    except (OSError, ValueError):
        return False
    return not keys.enabled


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
    config, guard = guard_public_bind(config)
    running = await start_server(config, http=http)
    # What the process holds now lives as long as it does (gc_pauses.py).
    freeze_startup_heap()
    if on_ready is not None:
        on_ready(running)
    else:
        log.info(listening_line(config, running.grpc_port, running.http_port, guard))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if reload is not None:

        def reload_routes() -> None:
            try:
                changed = running.core.deps.router.update(reload().models)
            except Exception:
                log.exception("SIGHUP: configuration not reloaded")
                return
            log.info(
                "SIGHUP: model routes reloaded; changed: %s (models: %s)",
                ", ".join(changed) or "none",
                ", ".join(running.core.deps.router.aliases),
            )

        loop.add_signal_handler(signal.SIGHUP, reload_routes)
    try:
        await stop.wait()
        log.info("stopping: finishing in-flight responses and draining writes")
    finally:
        await running.stop()
        log.info("stopped")
