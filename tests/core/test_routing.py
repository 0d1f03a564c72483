"""Routing: resolved once per stream lane, again on a model or settings change."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
from pathlib import Path

import pytest
from bidi_responses.client import AsyncResponsesClient, ResponsesError
from bidi_responses.server.config import RouteConfig, load_config
from bidi_responses.server.engine_config import SimConfig

from tests.conftest import FAST_SIM, ServerFactory
from tests.pipeline.server_process import serve_process


async def test_route_resolves_once_per_lane_and_again_on_a_model_change(
    server_factory: ServerFactory,
) -> None:
    async with asyncio.timeout(30):
        running = await server_factory()
        async with AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as client:
            base = int((await client.stats())["route_resolutions_total"])
            resolved: list[bool] = []
            async with client.connect() as stream:
                previous = None
                for model in ["sim-model"] * 4 + ["sim-other"] * 3 + ["sim-model"]:
                    response = await stream.create(
                        model=model, input="next step", previous_response_id=previous
                    )
                    assert response.raw["model"] == model
                    resolved.append(response.stats["route_resolved"])
                    previous = response.id
                # A second lane of the same stream resolves for itself, once.
                lane = [
                    await stream.create(model="sim-model", input="hi", stream_id="b")
                    for _ in range(3)
                ]
            stats = await client.stats()
        assert resolved == [True, False, False, False, True, False, False, True]
        assert [r.stats["route_resolved"] for r in lane] == [True, False, False]
        assert int(stats["route_resolutions_total"]) - base == 4


async def test_stateless_requests_resolve_every_time(server_factory: ServerFactory) -> None:
    async with asyncio.timeout(30):
        running = await server_factory()
        async with AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as client:
            responses = [await client.create(model="sim-model", input="hi") for _ in range(3)]
        assert [r.stats["route_resolved"] for r in responses] == [True, True, True]


async def test_unknown_model_lists_the_known_ones(server_factory: ServerFactory) -> None:
    async with asyncio.timeout(30):
        running = await server_factory()
        async with (
            AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as client,
            client.connect() as stream,
        ):
            ok = await stream.create(model="sim-model", input="hi")
            with pytest.raises(ResponsesError) as raised:
                await stream.create(model="gpt-9", input="hi", previous_response_id=ok.id)
            # The stream goes on after the error.
            again = await stream.create(model="sim-other", input="hi")
            with pytest.raises(ResponsesError) as unary:
                await client.create(model="gpt-9", input="hi")
        error = raised.value
        assert (error.code, error.param, error.status) == ("model_not_found", "model", 400)
        assert "gpt-9" in error.message and "sim-model, sim-other" in error.message
        assert again.status == "completed"
        assert unary.value.code == "model_not_found"


async def test_new_settings_for_an_alias_resolve_again(server_factory: ServerFactory) -> None:
    async with asyncio.timeout(30):
        running = await server_factory()
        router = running.core.deps.router
        async with (
            AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as client,
            client.connect() as stream,
        ):
            first = await stream.create(model="sim-model", input="hi")
            engine = router.resolve("sim-model").engine
            second = await stream.create(
                model="sim-model", input="hi", previous_response_id=first.id
            )
            # Reload with the same routes: nothing changes, nothing re-resolves.
            routes = dict(running.core.config.models)
            assert router.update(routes) == []
            third = await stream.create(
                model="sim-model", input="hi", previous_response_id=second.id
            )
            # New settings for sim-model (as SIGHUP with an edited config file does).
            faster = dataclasses.replace(FAST_SIM, answer_tokens=5)
            routes["sim-model"] = RouteConfig(engine="sim", sim=faster)
            assert router.update(routes) == ["sim-model"]
            fourth = await stream.create(
                model="sim-model", input="hi", previous_response_id=third.id
            )
            fifth = await stream.create(
                model="sim-model", input="hi", previous_response_id=fourth.id
            )
        flags = [r.stats["route_resolved"] for r in (first, second, third, fourth, fifth)]
        assert flags == [True, False, False, True, False]
        assert router.resolve("sim-model").engine is not engine
        assert fourth.usage is not None and fourth.usage.output_tokens < 10


def test_model_aliases_from_toml(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text(
        '[models.fast]\nengine = "sim"\n[models.fast.sim]\ntokens_per_second = 4000.0\n'
        "ttft_ms = 20.0\n"
        '[models.slow]\nengine = "sim"\n[models.slow.sim]\ntokens_per_second = 65.0\n'
    )
    config = load_config(path, data_dir=str(tmp_path / "data"))
    assert sorted(config.models) == ["fast", "slow"]
    assert config.models["fast"].sim == SimConfig(tokens_per_second=4000.0, ttft_ms=20.0)
    assert config.models["slow"].sim.tokens_per_second == 65.0
    path.write_text('[models.fast]\nengine = "sim"\nspeed = 3\n')
    with pytest.raises(ValueError, match=r"models\.fast: unknown setting 'speed'"):
        load_config(path)


async def test_server_from_a_toml_config(server_factory: ServerFactory, tmp_path: Path) -> None:
    path = tmp_path / "server.toml"
    path.write_text(
        "grpc_port = 0\n"
        f'data_dir = "{tmp_path / "data"}"\n'
        '[models.fast]\nengine = "sim"\n'
        "[models.fast.sim]\ntokens_per_second = 1000000.0\nttft_ms = 0.0\nanswer_tokens = 7\n"
    )
    async with asyncio.timeout(30):
        running = await server_factory(load_config(path))
        async with AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as client:
            response = await client.create(model="fast", input="hi")
            with pytest.raises(ResponsesError, match="Known models: fast\\."):
                await client.create(model="sim-model", input="hi")
        assert response.usage is not None and response.usage.output_tokens == 7


async def test_sighup_reloads_the_model_routes(tmp_path: Path) -> None:
    config = tmp_path / "server.toml"
    route = '[models.{0}]\nengine = "sim"\n[models.{0}.sim]\ntokens_per_second = 1000000.0\n'
    config.write_text(route.format("alpha"))
    async with asyncio.timeout(60):
        async with serve_process(tmp_path / "data", args=("--config", str(config))) as (
            process,
            port,
            log,
        ):
            async with AsyncResponsesClient(f"127.0.0.1:{port}") as client:
                assert (await client.create(model="alpha", input="hi")).status == "completed"
                with pytest.raises(ResponsesError, match=r"Known models: alpha\."):
                    await client.create(model="beta", input="hi")
                config.write_text(route.format("alpha") + route.format("beta"))
                process.send_signal(signal.SIGHUP)
                await log.wait_for("model routes reloaded")
                assert (await client.create(model="beta", input="hi")).status == "completed"
            process.send_signal(signal.SIGTERM)
            assert await process.wait() == 0
        assert "changed: beta (models: alpha, beta)" in str(log)
