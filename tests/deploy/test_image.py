"""The container image, built and run with podman as a platform runs it.

Built by ``deploy/build-image.sh`` (what ``make image`` runs) on a Debian base bootstrapped
here, since no image registry is reachable; the base's tarball is kept under
``.bidi-responses/`` and podman keeps the layers, so a later run rebuilds only what changed.
The container runs with a read-only root file system (not even a /tmp), no capabilities and
a volume for /data, published on random loopback ports. Through them: gRPC health, a Connect
turn, a WebSocket turn and ``/metrics``; then SIGTERM with a response in flight on a Connect
stream. The response finishes, the stream ends UNAVAILABLE (``server_shutting_down``), the
container exits 0 within the grace period, and a second container on the same volume reads
back every acknowledged response.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import subprocess
import time
import tomllib
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import httpx
import orjson
import pytest
import websockets
import yaml
from bidi_responses.bench.ports import free_port
from bidi_responses.client import AsyncResponsesClient
from bidi_responses.cluster.postgres import PostgresUnavailable, TempPostgres
from bidi_responses.codec import EventDecoder, params_to_pb
from bidi_responses.v1 import responses_pb2 as pb
from bidi_responses.v1 import responses_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2

from tests.mesh.conftest import error_info, health_stub

ROOT = Path(__file__).resolve().parents[2]
# One tag per checkout: test runs in two checkouts on one machine share podman's image store.
IMAGE = f"localhost/bidi-responses:test-{hashlib.sha256(bytes(ROOT)).hexdigest()[:12]}"
KEY = "deploy-test-key"
AUTH = (("authorization", f"Bearer {KEY}"),)
GRACE_S = 8.0
# 40 tokens/s and 40 tokens: a turn lasts about a second, so the one that SIGTERM interrupts
# is surely in flight, and finishes well within the grace period.
SERVE_ARGS = (
    "--config", "/etc/bidi-responses/server.toml", "--grace-period-s", str(GRACE_S),
    "--sim-tps", "40", "--sim-ttft-ms", "0", "--sim-tool-rounds", "0",
    "--route-setting", "sim.answer_tokens=40",
)  # fmt: skip
TERMINAL = ("response.completed", "response.incomplete", "response.failed")


def _podman_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(ROOT / "deploy" / "containers.conf")}


def _podman_unusable() -> str | None:
    """Why podman cannot run containers here, or None."""
    if shutil.which("podman") is None:
        return "podman is not installed (make podman installs podman, runc and mmdebstrap)"
    info = subprocess.run(
        ["podman", "info"], env=_podman_env(), capture_output=True, text=True, timeout=60
    )
    if info.returncode != 0:
        return f"podman cannot run here: {info.stderr.strip()[-300:]}"
    return None


UNUSABLE = _podman_unusable()
pytestmark = [
    pytest.mark.skipif(UNUSABLE is not None, reason=str(UNUSABLE)),
    # The first test also builds the image (its fixture): ~90 s cold on a 2-core machine.
    pytest.mark.timeout(280),
]


def podman(*args: str, timeout: float = 60) -> str:
    """``podman ARGS`` with the project's settings; its stdout (asserting it succeeded)."""
    done = subprocess.run(
        ["podman", *args], env=_podman_env(), capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"podman {' '.join(args)}: {done.stderr[-2000:]}"
    return done.stdout.strip()


async def apodman(*args: str) -> str:
    """``podman`` for async code: the event loop keeps serving the test's streams meanwhile."""
    process = await asyncio.create_subprocess_exec(
        "podman", *args, env=_podman_env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        async with asyncio.timeout(90):  # the callers' own timeouts are usually shorter
            out, err = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, f"podman {' '.join(args)}: {err.decode()[-2000:]}"
    return out.decode().strip()


@pytest.fixture(scope="module")
def image() -> str:
    """The image, built as ``make image`` builds it (cached layers make a rebuild quick)."""
    started = time.monotonic()
    build = subprocess.run(
        [str(ROOT / "deploy" / "build-image.sh"), IMAGE],
        cwd=ROOT,
        env={**_podman_env(), "CACHE_DIR": str(ROOT / ".bidi-responses" / "image-base")},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    print(f"image built in {time.monotonic() - started:.1f} s")  # shown with pytest -s
    return IMAGE


@pytest.fixture
def volume() -> Iterator[str]:
    """A fresh named volume for /data, removed afterwards."""
    name = f"bidi-responses-test-{uuid.uuid4().hex[:12]}"
    podman("volume", "create", name)
    try:
        yield name
    finally:
        subprocess.run(
            ["podman", "volume", "rm", "--force", name],
            env=_podman_env(),
            capture_output=True,
            timeout=60,
        )


@asynccontextmanager
async def container(image: str, volume: str) -> AsyncIterator[tuple[str, str, str]]:
    """A running server container: (id, gRPC address, HTTP address), removed at the end."""
    cid = await apodman(
        "run", "--detach", "--read-only", "--read-only-tmpfs=false", "--cap-drop=all",
        "--security-opt=no-new-privileges", "--volume", f"{volume}:/data",
        "--publish", "127.0.0.1::50051", "--publish", "127.0.0.1::8000",
        "--env", f"BIDI_RESPONSES_API_KEYS={KEY}=tenant-deploy", image, *SERVE_ARGS,
    )  # fmt: skip
    try:
        grpc_address = await apodman("port", cid, "50051/tcp")
        http_address = await apodman("port", cid, "8000/tcp")
        await _wait_serving(cid, grpc_address)
        yield cid, grpc_address, http_address
    finally:
        await apodman("rm", "--force", "--time", "0", cid)


async def _wait_serving(cid: str, address: str) -> None:
    """Poll gRPC health until SERVING (bounded by the caller's timeout)."""
    request = health_pb2.HealthCheckRequest(service="bidi_responses.v1.ResponsesService")
    async with grpc.aio.insecure_channel(address) as channel:
        health = health_stub(channel)
        while True:
            try:
                reply = await health.Check(request, timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                state = await apodman("inspect", "--format", "{{.State.Status}}", cid)
                assert state == "running", await apodman("logs", cid)
            await asyncio.sleep(0.1)  # polling a process in another namespace, not a sync


def test_image_is_small_and_holds_no_build_tools(image: str) -> None:
    """A non-root numeric user, the serve entry point, no pip or compiler in the image."""
    config = orjson.loads(podman("image", "inspect", "--format", "{{json .Config}}", image))
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["bidi-responses", "serve"]
    assert {"50051/tcp", "8000/tcp"} <= set(config["ExposedPorts"])
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert config["Labels"]["org.opencontainers.image.version"] == version
    check = (
        "import importlib.util, os, shutil; "
        "assert os.getuid() == 10001, os.getuid(); "
        "assert importlib.util.find_spec('pip') is None, 'pip in the image'; "
        "tools = [t for t in ('gcc', 'cc', 'make', 'git') if shutil.which(t)]; "
        "assert not tools, tools"
    )
    podman("run", "--rm", "--read-only", "--entrypoint", "python", image, "-c", check)
    size_mb = int(podman("image", "inspect", "--format", "{{.Size}}", image)) / 1e6
    print(f"image size {size_mb:.0f} MB")
    # 271 MB here: the bootstrapped base 178 MB, dependencies 88 MB, the project 5 MB.
    assert size_mb < 450


async def _websocket_turn(http_address: str) -> str:
    """One stored turn in WebSocket mode; its response id."""
    async with websockets.connect(
        f"ws://{http_address}/v1/responses", additional_headers={"authorization": f"Bearer {KEY}"}
    ) as ws:
        await ws.send(
            orjson.dumps(
                {"type": "response.create", "model": "sim-model", "input": "hi", "store": True}
            ).decode()
        )
        while True:
            event = orjson.loads(await ws.recv())
            assert event["type"] != "error", event
            if event["type"] == "response.completed":
                response_id: str = event["response"]["id"]
                return response_id


async def _read(call: Any, decoder: EventDecoder) -> dict[str, Any]:
    message = await call.read()
    assert message != grpc.aio.EOF, "the stream ended early"
    event: dict[str, Any] = decoder.event(message)
    return event


async def test_container_serves_drains_on_sigterm_and_keeps_acknowledged_work(
    image: str, volume: str
) -> None:
    acknowledged: dict[str, str] = {}  # response id -> its output text
    async with asyncio.timeout(150), container(image, volume) as (cid, grpc_address, http_addr):
        async with AsyncResponsesClient(grpc_address, api_key=KEY) as client:
            async with client.connect() as stream:
                turn = await stream.create(model="sim-model", input="hello", store=True)
            assert turn.status == "completed" and turn.output_text
            acknowledged[turn.id] = turn.output_text
        ws_id = await _websocket_turn(http_addr)
        acknowledged[ws_id] = ""
        async with httpx.AsyncClient(base_url=f"http://{http_addr}", timeout=10) as http:
            assert (await http.get("/readyz")).status_code == 200
            metrics = (await http.get("/metrics")).text
        completed = [
            line
            for line in metrics.splitlines()
            if line.startswith("bidi_responses_total{") and 'status="completed"' in line
        ]
        assert len(completed) == 2, completed  # the Connect turn and the WebSocket turn

        # A Connect stream with a response in flight, then SIGTERM to PID 1.
        async with grpc.aio.insecure_channel(grpc_address) as channel:
            call = pb_grpc.ResponsesServiceStub(channel).Connect(metadata=AUTH)
            decoder = EventDecoder()
            body = {"model": "sim-model", "input": "a long one", "store": True}
            await call.write(pb.ConnectRequest(response_create=params_to_pb(body)))
            while (await _read(call, decoder))["type"] != "response.output_text.delta":
                pass
            await apodman("kill", "--signal", "TERM", cid)
            signalled = time.monotonic()
            seen: list[str] = []
            final: dict[str, Any] | None = None
            while final is None:
                event = await _read(call, decoder)
                seen.append(event["type"] if event["type"] != "warning" else event["code"])
                if event["type"] in TERMINAL:
                    final = event["response"]
            assert "server_draining" in seen, seen
            assert final["status"] == "completed", final
            text = "".join(
                part["text"]
                for item in final["output"]
                if item["type"] == "message"
                for part in item["content"]
            )
            acknowledged[final["id"]] = text
            # The stream then ends UNAVAILABLE with the documented reason.
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                while True:
                    assert await call.read() != grpc.aio.EOF, "the stream ended OK"
            assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
            trailers = dict(ended.value.trailing_metadata() or ())
            assert trailers.get("error-code") == "server_shutting_down", trailers
            assert error_info(ended.value).reason == "server_shutting_down"
        exit_code = await apodman("wait", cid)
        took = time.monotonic() - signalled
        logs = await apodman("logs", cid)
        assert exit_code == "0", logs
        assert took < GRACE_S, f"exit {took:.1f} s after SIGTERM; grace {GRACE_S} s"
        assert "Traceback" not in logs and " ERROR " not in logs, logs
        print(f"SIGTERM to exit: {took:.2f} s")

    # A second container on the same volume has every acknowledged response.
    async with (
        asyncio.timeout(60),
        container(image, volume) as (_, grpc_address, _http),
        AsyncResponsesClient(grpc_address, api_key=KEY) as client,
    ):
        for response_id, text in acknowledged.items():
            stored = await client.get(response_id)
            assert stored.status == "completed"
            if text:
                assert stored.output_text == text


@pytest.fixture
def postgres() -> Iterator[TempPostgres]:
    """A throwaway PostgreSQL (Debian's, ``make postgres``) on a loopback port."""
    try:
        server = TempPostgres()
    except PostgresUnavailable as error:
        pytest.skip(f"the PostgreSQL overlay's configuration not run: {error}")
    with server:
        yield server


async def _require_password(server: TempPostgres, password: str) -> None:
    """Give the user a password and make loopback connections need it (initdb trusts all),
    so that only a password from the container's environment lets the server in."""
    conn = await asyncpg.connect(server.url)
    try:
        await conn.execute(f"ALTER USER {server.user} PASSWORD '{password}'")
        await conn.execute("CREATE DATABASE bidi")
        (server.data / "pg_hba.conf").write_text(
            "local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n"
        )
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()
    with pytest.raises(asyncpg.InvalidPasswordError):
        await (await asyncpg.connect(server.url.replace("/postgres", "/bidi"))).close()


async def test_postgres_overlay_configuration_runs_in_the_image(
    image: str, volume: str, postgres: TempPostgres, tmp_path: Path
) -> None:
    """The PostgreSQL overlay's ConfigMap, Secret files and variables, as its pods get them:
    the password from $PGPASSWORD (none in the URL), the compaction key from a read-only file,
    the API keys from $BIDI_RESPONSES_API_KEYS. A turn is stored in PostgreSQL."""
    password = uuid.uuid4().hex
    await _require_password(postgres, password)
    rendered = await asyncio.to_thread(
        subprocess.run,
        ["kubectl", "kustomize", str(ROOT / "deploy" / "k8s" / "overlays" / "postgres")],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    (config_map,) = (
        doc
        for doc in yaml.safe_load_all(rendered.stdout)
        if doc["kind"] == "ConfigMap"
        and doc["metadata"]["name"].startswith("bidi-responses-config")
    )
    toml = config_map["data"]["server.toml"]
    # The host's network (where this PostgreSQL listens), so free ports instead of the pod's.
    grpc_port, http_port = free_port(), free_port()
    for pod_value, here in (
        ("@postgres:5432/", f"@postgres:{postgres.port}/"),
        ("grpc_port = 50051", f"grpc_port = {grpc_port}"),
        ("http_port = 8000", f"http_port = {http_port}"),
    ):
        assert toml.count(pod_value) == 1, pod_value
        toml = toml.replace(pod_value, here)
    config_dir, key_dir = tmp_path / "config", tmp_path / "keys"
    for directory in (config_dir, key_dir):
        directory.mkdir()
        directory.chmod(0o755)
    (config_dir / "server.toml").write_text(toml)
    (config_dir / "server.toml").chmod(0o644)
    (key_dir / "compaction.key").write_text(uuid.uuid4().hex + uuid.uuid4().hex)
    (key_dir / "compaction.key").chmod(0o444)
    async with asyncio.timeout(90):
        cid = await apodman(
            "run", "--detach", "--network", "host", "--add-host", "postgres:127.0.0.1",
            "--read-only", "--read-only-tmpfs=false", "--cap-drop=all",
            "--security-opt=no-new-privileges", "--volume", f"{volume}:/data",
            "--volume", f"{config_dir}:/etc/bidi-responses:ro",
            "--volume", f"{key_dir}:/run/secrets/bidi-responses:ro",
            "--env", f"PGPASSWORD={password}",
            "--env", f"BIDI_RESPONSES_API_KEYS={KEY}=tenant-deploy",
            image, "--config", "/etc/bidi-responses/server.toml",
        )  # fmt: skip
        try:
            await _wait_serving(cid, f"127.0.0.1:{grpc_port}")
            async with (
                AsyncResponsesClient(f"127.0.0.1:{grpc_port}", api_key=KEY) as client,
                client.connect() as stream,
            ):
                turn = await stream.create(model="sim-model", input="hello", store=True)
            assert turn.status == "completed"
            await apodman("kill", "--signal", "TERM", cid)
            assert await apodman("wait", cid) == "0", await apodman("logs", cid)
        finally:
            await apodman("rm", "--force", "--time", "0", cid)
        conn = await asyncpg.connect(postgres.url.replace("/postgres", "/bidi"), password=password)
        try:
            tenant = await conn.fetchval(
                "SELECT tenant FROM usage_ledger WHERE response_id = $1", turn.id
            )
            stored = await conn.fetchval("SELECT count(*) FROM responses WHERE id = $1", turn.id)
        finally:
            await conn.close()
    assert (tenant, stored) == ("tenant-deploy", 1)
