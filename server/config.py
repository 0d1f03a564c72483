"""Server settings: one dataclass tree, filled from the command line or a TOML file."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bidi_responses.schema import JSONValue

from .engine_config import CompletionsConfig, SimConfig, UpstreamConfig

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


@dataclass(slots=True)
class Limits:
    """Per-request and per-stream bounds. Exceeding one is a 4xx/error event, not a crash."""

    max_input_items: int = 10_000
    max_item_chars: int = 10_485_760
    max_request_chars: int = 33_554_432
    max_tools: int = 128
    max_metadata_pairs: int = 16
    # Largest single client message a transport accepts (gRPC message, WebSocket frame, body).
    max_message_bytes: int = 64 * 1024 * 1024
    # Server-wide budget on request bytes being read or held before a request is parsed, over
    # every transport and stream at once (gRPC messages, HTTP bodies, WebSocket frames); past
    # it a message is refused with a retryable 429 / RESOURCE_EXHAUSTED (0 = no budget).
    max_inflight_request_bytes: int = 256 * 1024 * 1024
    # Accept permessage-deflate on WebSocket mode. Off: a client that offers it (the bare
    # websockets library does; the openai SDK does not) sends plain frames. On: inflated bytes
    # count against the budget above, and a message stops inflating where the budget has no
    # room (close 1013).
    websocket_compression: bool = False
    # Connections held at once (0 = derived from the descriptor limit, RLIMIT_NOFILE, whose
    # soft value start-up raises to the hard one): what is left after
    # ``reserved_descriptors`` is split evenly between the HTTP/WebSocket listener and the
    # gRPC listener. Past it: HTTP 503 ``too_many_connections`` (WebSocket: on the upgrade);
    # gRPC closes the connection at accept (grpc core's connection quota).
    max_connections: int = 0
    max_grpc_connections: int = 0
    # Descriptors kept for everything but client connections (store, journal, engines, logs).
    reserved_descriptors: int = 256
    # HTTP/WebSocket connections from one client address (0 = no limit; behind a proxy or a
    # mesh sidecar every client has its address, so set 0 there). Never more than half of
    # ``max_connections``, so one address cannot hold the whole listener. Past it: 429.
    max_connections_per_peer: int = 1000
    # Log lines about client faults (undecodable messages, connections refused, accept()
    # failures), per kind of line and minute; the rest are counted and summarised.
    client_fault_log_lines_per_minute: int = 10
    # Pre-inference work (checking, classifying, rendering) of a create with at least this
    # many characters of instructions and input runs in a worker thread; smaller ones inline.
    # So does the rendering of an answer (or an append's tool outputs) at least this long.
    offload_chars: int = 65_536
    # How long an append-mode response waits in response.done for its tool outputs.
    append_timeout_s: float = 300.0
    # A Connect stream or WebSocket connection is closed after this age, as the hosted API does.
    connection_max_age_s: float = 3600.0
    # How long before the age limit the warning event is sent.
    connection_warning_s: float = 60.0
    # Distinct named lanes (stream_id) one connection may use, as the hosted WebSocket mode
    # counts them: the default lane does not count, a lane that was used always does.
    max_lanes: int = 32
    # Responses running at once per connection; further creates wait, in order.
    max_active_responses: int = 16
    # Creates waiting (for their lane or for a slot) per connection; past it, an error.
    max_queued_responses: int = 256
    # Accepted steers waiting for one response's successor.
    max_pending_steers: int = 16
    # Server events buffered per stream before the producer waits for the client.
    outbound_queue_events: int = 512
    # A client that takes no message for this long (it stopped reading, so the transport's
    # buffers are full) is cut off: gRPC RESOURCE_EXHAUSTED, WebSocket close 1008, SSE ends.
    # Its in-flight responses are cancelled.
    write_timeout_s: float = 30.0


@dataclass(slots=True)
class CacheConfig:
    """The per-stream response cache. By default it keeps the most recent response only."""

    max_responses: int = 1
    max_bytes: int = 512 * 1024 * 1024
    # One budget across every stream's cache, in bytes of items and tokens as held in memory;
    # over it, the least recently used entry of any stream is evicted (a continuation from it
    # then falls back to the store, or gets previous_response_not_found).
    global_max_bytes: int = 1024 * 1024 * 1024
    # Stored responses made without a stream (HTTP, gRPC CreateResponse, background) whose
    # rendered state this process keeps, so a continuation naming one (over HTTP or a new
    # stream) skips re-rendering its history; within the global budget. 0: none kept.
    recent_max_responses: int = 1024


@dataclass(slots=True)
class DurabilityConfig:
    """How finished responses are made durable (see ``server/core/storage/journal.py``)."""

    # Journal each response's ledger row and stored form, durably, before its terminal event.
    # False acknowledges before the SQLite write lands (a crash can lose acknowledged work);
    # it exists to measure what durability costs.
    journal: bool = True
    # fdatasync each journal batch (False: survives a process crash, not a machine crash).
    fsync: bool = True
    segment_bytes: int = 4 * 1024 * 1024
    # Longest wait between retries of a failing SQLite write.
    max_retry_delay_s: float = 2.0
    # While the journal cannot write, how often to check whether it can again.
    probe_interval_s: float = 1.0
    # At shutdown, how long to wait for queued SQLite writes (the rest stay in the journal).
    drain_timeout_s: float = 30.0
    # How long the SQLite writer lets journaled jobs gather into one transaction (0: write
    # each batch at once). They are durable already; staged responses are readable meanwhile.
    write_linger_ms: float = 20.0


@dataclass(slots=True)
class StreamingConfig:
    """How engine output becomes delta events.

    Deltas already waiting when the server writes are merged into one event, up to
    ``max_delta_chars``; after an item's first delta (which goes out at once, so time to first
    token is unchanged), the server also waits up to ``delta_window_ms`` for more. Clients
    concatenate deltas, so the text they rebuild is unchanged; fewer messages cost less on
    transports with a high per-message price (grpc.aio: ~90 µs of server CPU per message, so
    one stream at 4,000 tokens/s needs the 2 ms window to stay under a quarter of a core).
    The same switch merges an item's deltas that wait in a stream's outbound queue behind a
    writer that fell behind (``lanes/outbound.py``), on every transport.
    """

    coalesce_deltas: bool = True
    delta_window_ms: float = 2.0
    max_delta_chars: int = 4096
    # Bounds of one batched gRPC message (``DeliveryOptions.batch_events``): events that are
    # ready at the moment of writing go out together, up to this many and about this many
    # bytes (a single larger event still goes out, alone).
    max_batch_events: int = 64
    max_batch_bytes: int = 262_144


@dataclass(slots=True)
class AuthConfig:
    """API keys, each mapped to a tenant (see ``server/core/tenancy/auth.py``). None configured =
    open
    server, which then binds to loopback only unless ``allow_unauthenticated_public`` is set."""

    # API key -> tenant. Prefer the keys file or the environment variable for real keys.
    api_keys: dict[str, str] = field(default_factory=dict)
    # A file of ``KEY TENANT`` lines.
    api_keys_file: str | None = None
    # An environment variable holding ``KEY=TENANT,KEY=TENANT``.
    api_keys_env: str = "BIDI_RESPONSES_API_KEYS"
    allow_unauthenticated_public: bool = False


@dataclass(slots=True)
class TlsConfig:
    """TLS for gRPC and HTTP/WebSocket from PEM files; ``client_ca_file`` turns on mTLS."""

    cert_file: str | None = None
    key_file: str | None = None
    client_ca_file: str | None = None

    @property
    def enabled(self) -> bool:
        """True when a certificate and key are configured."""
        return bool(self.cert_file and self.key_file)


@dataclass(slots=True)
class KeepaliveConfig:
    """HTTP/2 keepalive and connection age on the gRPC listener (docs/mesh.md explains each).

    Client pings are accepted down to ``min_client_ping_interval_s`` apart, with or without
    calls in flight, so idle agent streams waiting on a long tool run survive clients that ping
    every 10 s (grpc-go's and grpc-java's minimum). The server pings idle connections itself to
    find dead peers, and closes connections after ``max_connection_age_s`` (GOAWAY, then
    ``max_connection_age_grace_s`` for open calls) so load balancers can rebalance.
    """

    min_client_ping_interval_s: float = 5.0
    permit_pings_without_calls: bool = True
    # Pings arriving faster than the minimum tolerated before GOAWAY too_many_pings.
    max_ping_strikes: int = 2
    server_ping_interval_s: float = 60.0
    server_ping_timeout_s: float = 20.0
    # Connect streams end at ``limits.connection_max_age_s`` (60 min): the connection outlives
    # its longest stream, and the grace lets a stream opened just before GOAWAY run its hour.
    max_connection_age_s: float = 3900.0
    max_connection_age_grace_s: float = 3660.0


@dataclass(slots=True)
class TenantLimits:
    """Per-connection and per-tenant limits; past one: RESOURCE_EXHAUSTED / 429 naming it.
    0 means no limit."""

    max_streams_per_connection: int = 100
    max_streams_per_tenant: int = 1000
    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    # Server-wide load shedding on the gRPC listener: calls received but not yet picked up.
    # gRPC's defaults (1000 / 3000) cancel queued opens in a burst; past the hard limit new
    # calls get RESOURCE_EXHAUSTED at once.
    max_pending_calls: int = 10_000
    max_pending_calls_hard: int = 20_000


@dataclass(slots=True)
class StoreConfig:
    """Where stored responses and the usage ledger live.

    ``url`` empty: embedded SQLite in ``data_dir`` (one process). ``postgresql://...``: a
    database shared by replicas behind a proxy (docs/replicas.md).
    """

    url: str = ""
    # Connections per process to a PostgreSQL store.
    pool_size: int = 4
    # How long a starting server retries a PostgreSQL store that does not answer yet.
    connect_timeout_s: float = 30.0
    # Send a response's terminal event only after its store write and ledger row have landed.
    # None: yes for a shared store (so any replica can continue the conversation at once and a
    # replica that dies loses no acknowledged turn), no for SQLite (the write overlaps the
    # client's next turn).
    ack_after_write: bool | None = None
    # On drain, leave each stream's cached conversation state in the shared store so the
    # replica that gets the next turn restores it instead of re-rendering (handoff.py).
    state_handoff: bool = True
    # An unclaimed state is dropped after this long.
    state_ttl_s: float = 3600.0


@dataclass(slots=True)
class CompactionConfig:
    """``/v1/responses/compact``: the key that seals compaction tokens, and summary size.

    ``key_file`` empty means ``<data_dir>/compaction.key``, created with a random key on first
    use. Servers that must accept each other's compaction items share one key file.
    """

    key_file: str = ""
    summary_item_chars: int = 400


@dataclass(slots=True)
class BackgroundConfig:
    """Background mode (``background: true`` over HTTP): bounds on what is kept per response.

    Each response keeps its last ``max_events`` events for resumption (``starting_after``);
    the logs of the ``max_finished`` most recently finished responses are kept after they end.
    """

    max_running: int = 256
    max_events: int = 20_000
    max_finished: int = 128


@dataclass(slots=True)
class RouteConfig:
    """One model alias: which engine serves it, with which settings."""

    engine: str = "sim"
    sim: SimConfig = field(default_factory=SimConfig)
    script_path: str | None = None
    # The backend of ``engine = "completions"`` (an OpenAI-compatible completions endpoint).
    completions: CompletionsConfig = field(default_factory=CompletionsConfig)
    # The upstream of ``engine = "upstream"`` (another Responses API).
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)


@dataclass(slots=True)
class ServerConfig:
    """Everything the server needs to start."""

    host: str = "127.0.0.1"
    grpc_port: int = 50051
    http_port: int = 8000
    data_dir: str = ".bidi-responses"
    limits: Limits = field(default_factory=Limits)
    cache: CacheConfig = field(default_factory=CacheConfig)
    streaming: StreamingConfig = field(default_factory=StreamingConfig)
    # Model alias -> route. The CLI fills "sim-model" from its engine flags.
    models: dict[str, RouteConfig] = field(default_factory=lambda: {"sim-model": RouteConfig()})
    # Pre-inference stages in order, by registered name ("validation", "secrets", "injection")
    # or "module:attribute" / "path/to/file.py:attribute" for your own (docs/pipeline.md).
    stages: list[str] = field(default_factory=lambda: ["validation", "secrets", "injection"])
    # Settings per stage, keyed like ``stages``, passed to the stage's factory as keyword
    # arguments. TOML: ``[stage_settings.secrets]`` then ``block = true``.
    stage_settings: dict[str, dict[str, JSONValue]] = field(default_factory=dict)
    post_queue_size: int = 1024
    durability: DurabilityConfig = field(default_factory=DurabilityConfig)
    grace_period_s: float = 10.0
    # Once no stream is open for this long, freed memory goes back to the OS (0 = never).
    trim_memory_idle_s: float = 1.0
    # On SIGTERM, how long health reports NOT_SERVING (and new work gets UNAVAILABLE / 503)
    # before in-flight streams are told to finish: time for load balancers to notice.
    drain_notice_s: float = 0.0
    auth: AuthConfig = field(default_factory=AuthConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    keepalive: KeepaliveConfig = field(default_factory=KeepaliveConfig)
    tenant_limits: TenantLimits = field(default_factory=TenantLimits)
    # The Prometheus scrape path on the HTTP listener ("" turns it off).
    metrics_path: str = "/metrics"
    # OpenTelemetry server spans on gRPC, HTTP and WebSocket (needs the ``otel`` extra).
    tracing: bool = False
    store: StoreConfig = field(default_factory=StoreConfig)
    compaction: CompactionConfig = field(default_factory=CompactionConfig)
    background: BackgroundConfig = field(default_factory=BackgroundConfig)
    # Server processes sharing the ports (``serve --workers N``), and which one this is.
    workers: int = 1
    worker_index: int = 0

    @property
    def store_path(self) -> Path:
        """The SQLite file holding stored responses and the usage ledger."""
        return Path(self.data_dir) / "responses.db"

    @property
    def journal_dir(self) -> Path:
        """Where each process keeps its write-ahead journal segments."""
        return Path(self.data_dir) / "journal"

    @property
    def compaction_key_path(self) -> Path:
        """The file holding the key that seals compaction tokens."""
        return Path(self.compaction.key_file or Path(self.data_dir) / "compaction.key")


def _apply(target: DataclassInstance, values: Mapping[str, object], where: str) -> None:
    known = {f.name: f for f in fields(target)}
    for key, value in values.items():
        if key not in known:
            raise ValueError(f"{where}: unknown setting '{key}' (known: {', '.join(known)})")
        current = getattr(target, key)
        if is_dataclass(current) and not isinstance(current, type) and isinstance(value, dict):
            _apply(current, value, f"{where}.{key}")
        else:
            setattr(target, key, value)


def load_config(path: str | Path | None, **overrides: object) -> ServerConfig:
    """Read a TOML file (sections match the dataclasses) and apply keyword overrides."""
    config = ServerConfig()
    if path is not None:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
        models = data.pop("models", None)
        _apply(config, data, str(path))
        if models is not None:
            config.models = {}
            for alias, route_values in models.items():
                route = RouteConfig()
                _apply(route, route_values, f"{path}: models.{alias}")
                # A path in the file means the same wherever the server is started from.
                here = Path(path).parent
                if route.script_path is not None:
                    route.script_path = str(here / Path(route.script_path))
                completions = route.completions
                if completions.tokenizer:
                    completions.tokenizer = str(here / Path(completions.tokenizer))
                if completions.chat_template:
                    completions.chat_template = str(here / Path(completions.chat_template))
                config.models[alias] = route
    _apply(config, {k: v for k, v in overrides.items() if v is not None}, "overrides")
    return config


def apply_route_setting(route: RouteConfig, setting: str) -> None:
    """Apply one ``KEY=VALUE`` to a model route: the key dotted as in the config file's
    ``[models.<alias>]`` table (``completions.context_window``), the value a TOML value (a
    bare word is taken as a string)."""
    where = f"route setting '{setting}'"
    key, equals, text = setting.partition("=")
    path = key.strip().split(".")
    if not equals or not all(path):
        raise ValueError(f"{where}: expected KEY=VALUE, e.g. completions.context_window=8192")
    value: object
    try:
        value = tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        value = text.strip()
    for part in reversed(path[1:]):
        value = {part: value}
    _apply(route, {path[0]: value}, where)
