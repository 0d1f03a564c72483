"""Open-model routes through the whole server, with backends that cannot be llama.cpp here:

* a template that renders earlier turns anew (Mistral style) is caught on the turn it does:
  the break is counted (GetStats ``cache.prompt_rerenders`` and the
  ``bidi_prompt_rerenders_total`` metric) and ``cached_tokens`` is the prefix the two renders
  really share, recomputed from fresh renders; a prefix-stable template (Llama 3 style) counts
  nothing and reuses everything;
* a malformed tool call from the model (replayed token ids) ends the response ``failed`` with
  ``engine_bad_response``, and the stream goes on.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any, cast

import httpx
from bidi_responses.client import AsyncResponsesClient
from bidi_responses.schema import Item
from bidi_responses.server.config import ServerConfig
from bidi_responses.server.core.rendering.render import common_prefix
from bidi_responses.server.core.rendering.tokenizer import load_encoding
from bidi_responses.server.engines.template_format import TemplateSettings, build_template_format
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ServerFactory
from tests.engines.model_files import write_model_dir
from tests.llama.bad_backends import bad_backends, closed_port
from tests.llama.conftest import completions_route

WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather of a city.",
    # Sorted keys: over gRPC (a Struct, which keeps no order) that is the order the model sees.
    "parameters": {"properties": {"city": {"type": "string"}}, "type": "object"},
}


def _user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def _rerender_metric(text: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "bidi_prompt_rerenders_total"
    )


async def test_prefix_breaks_are_counted_and_cached_tokens_stay_true(
    tmp_path: Path, server_factory: ServerFactory
) -> None:
    routes = {}
    renderers = {}
    for family in ("mistral", "llama3"):
        files = write_model_dir(tmp_path / family, family)
        nowhere = f"http://127.0.0.1:{closed_port()}/v1"  # never called: generate is false
        routes[family] = completions_route(nowhere, format="template", tokenizer=str(files))
        settings = TemplateSettings(str(files))
        renderers[family] = build_template_format(settings, load_encoding()).renderer
    config = ServerConfig(grpc_port=0, http_port=0, data_dir=str(tmp_path / "data"))
    config.models = dict(routes)
    running = await server_factory(config, http=True)
    turns = [_user("What is the weather in Paris?"), _user("And in Zürich?"), _user("Thanks!")]
    cached: dict[str, list[int]] = {}
    async with (
        asyncio.timeout(30),
        AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as client,
        client.connect() as stream,
    ):
        for family in routes:
            previous: str | None = None
            cached[family] = []
            for turn in turns:
                response = await stream.create(
                    model=family,
                    instructions="Be brief.",
                    tools=[WEATHER],
                    input=[turn],
                    previous_response_id=previous,
                    generate=False,
                    store=False,
                )
                assert response.status == "completed", response.error
                assert response.usage is not None
                cached[family].append(response.usage.cached_tokens)
                previous = response.id
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{running.http_port}") as http:
            stats = (await http.get("/v1/stats")).json()
            metric = _rerender_metric((await http.get("/metrics")).text)

    for family, renderer in renderers.items():
        renders = [
            renderer.render_conversation("Be brief.", [WEATHER], cast(list[Item], turns[:n]))
            for n in range(1, len(turns) + 1)
        ]
        expected = [0] + [common_prefix(a, b) for a, b in itertools.pairwise(renders)]
        assert cached[family] == expected, family
        if family == "llama3":  # appends only: the whole previous render is reused
            assert expected[1:] == [len(render) for render in renders[:-1]]
        else:  # the tools and system prompt moved to the new last user message
            assert all(
                shared < len(render)
                for shared, render in zip(expected[1:], renders[:-1], strict=True)
            )
    # Mistral broke the prefix on turns 2 and 3; Llama 3 never did.
    assert stats["cache"]["prompt_rerenders"] == 2
    assert metric == 2


async def test_a_malformed_tool_call_fails_the_response_and_the_stream_goes_on(
    tmp_path: Path, server_factory: ServerFactory
) -> None:
    files = write_model_dir(tmp_path / "chatml", "chatml")
    chat = build_template_format(TemplateSettings(str(files)), load_encoding())
    model = chat.renderer.tokenizer  # type: ignore[attr-defined]
    end = model.token_id("<|im_end|>")
    broken = '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>'
    async with asyncio.timeout(30), bad_backends() as backend:
        backend.replies = [[*model.encode(broken), end], [*model.encode("Sorry."), end]]
        route = completions_route(
            backend.base_url("replay"), format="template", tokenizer=str(files)
        )
        config = ServerConfig(grpc_port=0, http_port=0, data_dir=str(tmp_path / "data"))
        config.models = {"open": route}
        running = await server_factory(config)
        async with (
            AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as client,
            client.connect() as stream,
        ):
            failed = await stream.create(
                model="open", tools=[WEATHER], input=[_user("Weather?")], store=False
            )
            assert failed.status == "failed"
            assert failed.error is not None
            assert failed.error["code"] == "engine_bad_response"
            assert "malformed tool call" in failed.error["message"]
            # The same stream serves the next turn.
            answered = await stream.create(
                model="open", tools=[WEATHER], input=[_user("Weather?")], store=False
            )
            assert answered.status == "completed", answered.error
            assert answered.output_text == "Sorry."
    # Each prompt ended with the model's generation prompt, in its own vocabulary.
    assert all(
        prompt[-len(chat.assistant_start) :] == list(chat.assistant_start)
        for prompt in backend.prompts
    )


async def test_a_stored_continuation_on_a_new_stream_counts_only_what_is_shared(
    tmp_path: Path, server_factory: ServerFactory
) -> None:
    files = write_model_dir(tmp_path / "mistral", "mistral")
    nowhere = f"http://127.0.0.1:{closed_port()}/v1"
    config = ServerConfig(grpc_port=0, http_port=0, data_dir=str(tmp_path / "data"))
    config.models = {"open": completions_route(nowhere, format="template", tokenizer=str(files))}
    running = await server_factory(config)
    renderer = build_template_format(TemplateSettings(str(files)), load_encoding()).renderer
    first_input, second_input = _user("Weather in Paris?"), _user("And in Rome?")
    create: dict[str, Any] = {
        "model": "open",
        "instructions": "Be brief.",
        "tools": [WEATHER],
        "generate": False,
    }
    address = f"127.0.0.1:{running.grpc_port}"
    async with asyncio.timeout(30), AsyncResponsesClient(address) as client:
        async with client.connect() as stream:
            first = await stream.create(input=[first_input], store=True, **create)
        # Another stream has no cached state: the chain comes back from the store.
        async with client.connect() as stream:
            second = await stream.create(
                input=[second_input], previous_response_id=first.id, store=True, **create
            )
    assert second.status == "completed", second.error
    before = renderer.render_conversation("Be brief.", [WEATHER], cast(list[Item], [first_input]))
    after = renderer.render_conversation(
        "Be brief.", [WEATHER], cast(list[Item], [first_input, second_input])
    )
    assert second.usage is not None
    assert second.usage.input_tokens == len(after)
    assert second.usage.cached_tokens == common_prefix(before, after) < len(before)
