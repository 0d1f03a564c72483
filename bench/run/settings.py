"""What a comparison runs: the whole run's configuration, one server's settings, a cell's result."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bidi_responses.server.config import StreamingConfig
from bidi_responses.server.engine_config import SimConfig

from ..clients import ModeInfo
from ..jsontypes import JSONObject
from ..sim_backend import sim_body
from ..workload import WorkloadSpec

__all__ = [
    "DEFAULT_DELTA_WINDOW_MS",
    "MALLOC_TUNED",
    "CellResult",
    "CompareConfig",
    "ServerSettings",
    "window_label",
]


#: The server's default delta merging window (ms): every cell runs with it unless it says not.
DEFAULT_DELTA_WINDOW_MS: float = StreamingConfig().delta_window_ms


def window_label(window: float | None) -> str:
    """How a delta merging policy is named in tables: off, or the window (and if default)."""
    if window is None:
        return "off"
    return f"window {window:g} ms" + (" (default)" if window == DEFAULT_DELTA_WINDOW_MS else "")


@dataclass(slots=True)
class ServerSettings:
    """One server configuration (written to a TOML file the server reads)."""

    tokens_per_second: float = 1000.0
    ttft_ms: float = 50.0
    prefill_tokens_per_second: float = 100_000.0
    tool_rounds: int = 25
    function_call_tokens: int = 40
    answer_tokens: int = 200
    seed: int = 0
    coalesce_deltas: bool = True
    delta_window_ms: float = DEFAULT_DELTA_WINDOW_MS
    engine: str = "sim"
    script_path: str | None = None
    http: bool = True
    workers: int = 1
    # A real backend (engine "completions"): its OpenAI base URL, model name, API key variable.
    backend_url: str | None = None
    backend_model: str = ""
    backend_api_key_env: str = ""
    backend_format: str = "generic"
    # The simulated engine in its own process (``bench.sim_backend``) at this base URL: the
    # server serves it through its ``completions`` route, the sim's settings in each request.
    sim_backend_url: str | None = None
    # TLS on every listener (PEM files): the network sweep's servers.
    tls_cert: str | None = None
    tls_key: str | None = None

    def sim_config(self) -> SimConfig:
        """The simulated engine these settings describe."""
        return SimConfig(
            tokens_per_second=self.tokens_per_second,
            ttft_ms=self.ttft_ms,
            prefill_tokens_per_second=self.prefill_tokens_per_second,
            tool_rounds=self.tool_rounds,
            function_call_tokens=self.function_call_tokens,
            answer_tokens=self.answer_tokens,
            seed=self.seed,
        )

    def toml(self) -> str:
        """The server's config file."""
        lines = [
            f"workers = {int(self.workers)}",
            "",
            "[streaming]",
            f"coalesce_deltas = {str(self.coalesce_deltas).lower()}",
            f"delta_window_ms = {float(self.delta_window_ms)!r}",
            "",
            '[models."sim-model"]',
            f'engine = "{self.engine}"',
        ]
        if self.script_path:
            lines.append(f"script_path = {_toml_str(self.script_path)}")
        if self.backend_url:
            lines[lines.index(f'engine = "{self.engine}"')] = 'engine = "completions"'
            lines += [
                "",
                '[models."sim-model".completions]',
                f"base_url = {_toml_str(self.backend_url)}",
                f"model = {_toml_str(self.backend_model)}",
                f"api_key_env = {_toml_str(self.backend_api_key_env)}",
                f"format = {_toml_str(self.backend_format)}",
            ]
        elif self.sim_backend_url and self.engine == "sim":
            lines[lines.index('engine = "sim"')] = 'engine = "completions"'
            lines += [
                "",
                '[models."sim-model".completions]',
                f"base_url = {_toml_str(self.sim_backend_url)}",
                'format = "generic"',
                # The history sweep's longest prompt, and the keep-up test's answers, fit.
                "context_window = 4194304",
                "max_output_tokens = 65536",
                "",
                '[models."sim-model".completions.extra_body.sim]',
            ]
            sim = sim_body(self.sim_config())["sim"]
            assert isinstance(sim, dict)
            lines += [f"{key} = {value!r}" for key, value in sim.items()]
        lines += [
            "",
            '[models."sim-model".sim]',
            f"tokens_per_second = {float(self.tokens_per_second)!r}",
            f"ttft_ms = {float(self.ttft_ms)!r}",
            f"prefill_tokens_per_second = {float(self.prefill_tokens_per_second)!r}",
            f"tool_rounds = {int(self.tool_rounds)}",
            f"function_call_tokens = {int(self.function_call_tokens)}",
            f"answer_tokens = {int(self.answer_tokens)}",
            f"seed = {int(self.seed)}",
        ]
        if self.tls_cert and self.tls_key:
            lines += [
                "",
                "[tls]",
                f"cert_file = {_toml_str(self.tls_cert)}",
                f"key_file = {_toml_str(self.tls_key)}",
            ]
        return "\n".join(lines) + "\n"


def _toml_str(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(slots=True)
class CompareConfig:
    """Everything ``compare`` runs; the defaults are ``make compare``."""

    modes: list[ModeInfo]
    out_dir: Path
    sweeps: list[str] = field(
        default_factory=lambda: ["headline", "keepup", "history", "tps", "concurrency", "steer"]
    )
    repeats: int = 3
    seed: int = 0
    # Headline rollout.
    turns: int = 25
    output_tokens: int = 4000
    tool_ms: float = 0.0
    tps: float = 1000.0
    ttft_ms: float = 50.0
    trace: str | None = None
    # Run the rollouts against a real completions backend instead of the sim engine.
    backend_url: str | None = None
    backend_model: str = ""
    backend_api_key_env: str = ""
    backend_format: str = "generic"
    # Where the simulated engine runs: "process" (its own process, served through the
    # server's completions route, as in a deployment) or "inproc" (inside the server, as
    # reports before the engine had its own process measured).
    engine: str = "process"
    # tokens/s sweep (a shorter rollout).
    tps_values: list[float] = field(default_factory=lambda: [65.0, 1000.0, 4000.0])
    tps_turns: int = 10
    tps_output_tokens: int = 4000
    slow_tps: float = 100.0
    slow_modes: list[ModeInfo] | None = None
    slow_repeats: int = 1
    tps_modes: list[ModeInfo] | None = None
    # History-length sweep.
    history_sizes: list[int] = field(default_factory=lambda: [1000, 25_000, 100_000, 200_000])
    history_turns: int = 6
    history_small_tokens: int = 256
    history_repeats: int = 3
    history_modes: list[ModeInfo] | None = None
    # Concurrency sweep.
    agents: list[int] = field(default_factory=lambda: [1, 4, 16, 64])
    concurrency_turns: int = 5
    concurrency_output_tokens: int = 2000
    concurrency_modes: list[ModeInfo] | None = None
    concurrency_repeats: int = 2
    concurrency_processes: int = 2
    # The sweep runs once per server worker count; counts above 1 run ``workers_modes``.
    concurrency_workers: list[int] = field(default_factory=lambda: [1, 2])
    workers_modes: list[ModeInfo] | None = None
    # A second concurrency sweep with this window instead of the default (0: merge only what
    # is ready, the old default), for concurrency_window_modes; skipped if it is the default.
    concurrency_window: float = 0.0
    concurrency_window_modes: list[ModeInfo] | None = None
    # Keep-up test.
    keepup_tps: float = 4000.0
    keepup_tokens: int = 4000
    keepup_responses: int = 3
    keepup_modes: list[ModeInfo] | None = None
    keepup_windows: list[float | None] = field(
        default_factory=lambda: [None, 0.0, DEFAULT_DELTA_WINDOW_MS]
    )
    # Steering: responses steered at their response.created, per stream mode, on one server
    # whose engine takes ``steer_ttft_ms`` to a first token (so the steer lands before it).
    steer_rounds: int = 30
    steer_modes: list[ModeInfo] | None = None
    steer_ttft_ms: float = 20.0
    steer_tps: float = 2000.0
    steer_answer_tokens: int = 40
    # Network sweep (its own target): the rollout through an emulated link per RTT and rate
    # (0 or None: unlimited), over TLS unless network_tls is off.
    network_rtts: list[float] = field(default_factory=lambda: [0.0, 2.0, 20.0, 80.0])
    network_mbits: list[float | None] = field(default_factory=lambda: [None, 100.0, 10.0])
    network_turns: int = 25
    network_output_tokens: int = 4000
    network_repeats: int = 3
    network_modes: list[ModeInfo] | None = None
    network_tls: bool = True
    # The links (RTT ms, Mbit/s or None) measured with Envoy between the link and the server,
    # for WebSocket mode, Connect and (the baseline) HTTP with a new connection per turn.
    network_mesh: list[tuple[float, float | None]] = field(
        default_factory=lambda: [(20.0, None), (80.0, 10.0)]
    )
    # The links measured with ``network_agents`` agents in one client process (Connect's on
    # one channel, WebSocket mode's on a connection each), the concurrency sweep's rollout.
    network_multiplex: list[tuple[float, float | None]] = field(
        default_factory=lambda: [(20.0, None), (80.0, 10.0)]
    )
    network_agents: int = 16
    # The same agents on one connection, a lane each (one Connect stream, one WebSocket).
    network_lanes: list[tuple[float, float | None]] = field(
        default_factory=lambda: [(20.0, None), (80.0, 10.0)]
    )
    # The links measured with large tool outputs (``network_large_tokens`` a turn), for
    # WebSocket mode and Connect: an upload larger than HTTP/2's initial window.
    network_large: list[tuple[float, float | None]] = field(default_factory=lambda: [(80.0, 100.0)])
    network_large_turns: int = 5
    network_large_tokens: int = 50_000
    # The links measured with llama.cpp (the tiny generated model, in its own process) as the
    # engine, every network mode: a short rollout, since the model's context is 8192 tokens.
    network_llama: list[tuple[float, float | None]] = field(
        default_factory=lambda: [(0.0, None), (20.0, None)]
    )
    network_llama_turns: int = 5
    network_llama_tokens: int = 400
    # Environment.
    store_all: bool = False
    malloc_tuned: bool = False
    show_progress: bool = True
    command: str = ""

    def workload_spec(self, tool_turns: int, tool_output_tokens: int) -> WorkloadSpec:
        """A rollout of this run's seed and tool time with the given turns and output size."""
        return WorkloadSpec(
            seed=self.seed,
            tool_turns=tool_turns,
            tool_output_tokens=tool_output_tokens,
            tool_ms=self.tool_ms,
        )


@dataclass(slots=True)
class CellResult:
    """The raw outcome of one cell: its settings, one entry per run, every turn."""

    name: str
    kind: str
    params: JSONObject
    runs: list[JSONObject] = field(default_factory=list)
    turns: list[JSONObject] = field(default_factory=list)


MALLOC_TUNED = "glibc.malloc.trim_threshold=268435456:glibc.malloc.mmap_threshold=268435456"
