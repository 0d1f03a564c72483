"""An open model's own tokenizer, chat template and tool-call format (``template`` format).

* the tokenizer read from the model's files encodes and decodes as the model does;
* templates render in the sandbox with the variables and rules the well-known servers use;
* incremental rendering equals a fresh render for every template family (property-based),
  and the prefix-stability report: how often each family renders earlier turns anew;
* tool calls parse while streaming, in tags and as bare JSON; malformed calls fail clearly.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pytest
from bidi_responses.schema import Item, JSONObject
from bidi_responses.server.config import load_config
from bidi_responses.server.core.api.errors import ApiError
from bidi_responses.server.core.ports import (
    Delta,
    EngineError,
    EngineEvent,
    EngineRequest,
    ItemEnd,
    ItemStart,
)
from bidi_responses.server.core.rendering.render import common_prefix
from bidi_responses.server.core.rendering.tokenizer import load_encoding
from bidi_responses.server.engines import build_engine
from bidi_responses.server.engines.chat_template import ChatTemplate, TemplateRenderer
from bidi_responses.server.engines.completions import CompletionsEngine
from bidi_responses.server.engines.formats import ChatFormat
from bidi_responses.server.engines.model_tokenizer import (
    ModelTokenizer,
    TokenizerLoadError,
    decode_tokens,
    load_model_tokenizer,
)
from bidi_responses.server.engines.template_format import TemplateSettings, build_template_format
from bidi_responses.server.engines.tool_calls import TemplateCompletionParser, ToolCallSyntax
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.test_render import SURROGATES
from tests.engines.model_files import TEMPLATES, write_model_dir

FAMILIES = tuple(TEMPLATES)
WEATHER: JSONObject = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather of a city.",
    "parameters": {
        "type": "object",
        "properties": {"zeta": {"type": "string"}, "city": {"type": "string"}},
        "required": ["city"],
    },
}


@functools.cache
def model_dir(family: str) -> Path:
    import tempfile

    return write_model_dir(Path(tempfile.mkdtemp(prefix="open-model-")) / family, family)


@functools.cache
def chat_format(family: str) -> ChatFormat:
    return build_template_format(TemplateSettings(str(model_dir(family))), load_encoding())


def renderer(family: str) -> TemplateRenderer:
    found = chat_format(family).renderer
    assert isinstance(found, TemplateRenderer)
    return found


def tokenizer() -> ModelTokenizer:
    return renderer("chatml").tokenizer


def user(text: str) -> Item:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def answer(text: str) -> Item:
    return cast(
        Item,
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text}],
        },
    )


def call(call_id: str, arguments: str = '{"city": "Paris"}') -> Item:
    return {
        "type": "function_call",
        "call_id": call_id,
        "name": "get_weather",
        "arguments": arguments,
    }


def output(call_id: str, text: str = "Sunny.") -> Item:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


# -- tokenizer ---------------------------------------------------------------------------------


def test_tokenizer_reads_the_models_files() -> None:
    model = tokenizer()
    assert model.chat_template.startswith("{%- if tools %}")
    assert model.eos_token == "<|im_end|>"
    assert model.vocab_size < 1000  # its own small vocabulary, nothing like o200k
    text = "<|im_start|>user\nÜber café 東京 🙂<|im_end|>\n<tool_call>"
    ids = model.encode(text)
    assert ids[0] == model.token_id("<|im_start|>")
    assert ids[-1] == model.token_id("<tool_call>")
    assert decode_tokens(model, ids) == text
    assert load_model_tokenizer(model_dir("chatml") / "tokenizer.json").encode(text) == ids


def test_tokenizer_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(TokenizerLoadError, match="no such file"):
        load_model_tokenizer(tmp_path / "missing")
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerLoadError, match="cannot read"):
        load_model_tokenizer(tmp_path)
    with pytest.raises(ValueError, match="needs 'tokenizer'"):
        build_template_format(TemplateSettings(""), load_encoding())


# -- template ----------------------------------------------------------------------------------


def test_template_variables_and_rules_of_the_well_known_servers() -> None:
    template = ChatTemplate(
        "{{ bos_token }}{% for m in messages %}{{ m.content }}|"
        "{% for c in m.tool_calls or [] %}{{ c.function.arguments | tojson }}"
        "{{ c.function.arguments.city }}{% endfor %}{% endfor %}"
        "{% for t in tools %}{{ t | tojson }}{% endfor %}"
        "{% if add_generation_prompt %}GO{% endif %}{{ strftime_now('%Y') | length }}",
        bos_token="<s>",
    )
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Zürich?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "w", "arguments": {"zeta": 1, "city": "Zürich"}}}],
        },
    ]
    tools = [{"type": "function", "function": {"name": "w", "parameters": {"z": 1, "a": 2}}}]
    rendered = template.render(messages, tools, add_generation_prompt=True)
    # bos, non-ASCII kept, key order kept, arguments are objects, the generation prompt.
    assert rendered.startswith("<s>Zürich?|")
    assert '{"zeta": 1, "city": "Zürich"}Zürich' in rendered
    assert '"parameters": {"z": 1, "a": 2}' in rendered
    assert rendered.endswith("GO4")


def test_templates_run_sandboxed_and_refusals_are_client_errors() -> None:
    escape = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ApiError, match="cannot render"):
        escape.render([], None, add_generation_prompt=False)
    llama3 = renderer("llama3")
    two_calls = [user("hi"), call("a"), call("b")]
    with pytest.raises(ApiError, match="only supports single tool-calls"):
        llama3.render_text(None, [WEATHER], two_calls)
    with pytest.raises(ValueError, match="chat template: line 1"):
        ChatTemplate("{% if %}")


def test_tools_reach_the_model_in_the_clients_key_order() -> None:
    for family in FAMILIES:
        text = renderer(family).render_text(None, [WEATHER], [user("Weather?")])
        assert text.index('"zeta"') < text.index('"city"'), family


def test_generation_prompt_and_stops_come_from_the_template() -> None:
    model = tokenizer()
    chatml = chat_format("chatml")
    assert decode_tokens(model, chatml.assistant_start) == "<|im_start|>assistant\n"
    assert model.token_id("<|im_end|>") in chatml.stop_token_ids
    assert chatml.call_token == model.token_id("<tool_call>")
    opened = decode_tokens(model, chatml.call_header("get_weather"))
    assert opened == '<tool_call>\n{"name": "get_weather", "arguments": '
    llama3 = chat_format("llama3")
    expected = "<|start_header_id|>assistant<|end_header_id|>\n\n"
    assert decode_tokens(model, llama3.assistant_start) == expected
    assert decode_tokens(model, llama3.call_header("x")) == '{"name": "x", "parameters": '
    assert llama3.call_token is None
    assert chat_format("mistral").assistant_start == ()


# -- incremental rendering ---------------------------------------------------------------------

texts = st.lists(
    st.one_of(
        st.text(st.characters(codec="utf-8", exclude_categories=SURROGATES), max_size=12),
        st.sampled_from(["<|im_end|>", "<tool_call>", "[INST]", "\n", " ", "{", '"', "é", "漢"]),
    ),
    min_size=1,
    max_size=4,
).map("".join)


@st.composite
def agent_turns(draw: st.DrawFn) -> list[list[Item]]:
    """Turns of an agent loop: a user message, then tool rounds, then an answer."""
    turns: list[list[Item]] = []
    for index in range(draw(st.integers(1, 4))):
        turns.append([user(draw(texts))])
        for round_ in range(draw(st.integers(0, 2))):
            call_id = f"call_{index}_{round_}"
            model_turn = [call(call_id, draw(st.sampled_from(['{"city": "Paris"}', "{}"])))]
            if draw(st.booleans()):
                model_turn.insert(0, thought(draw(texts)))
            turns.append(model_turn)
            turns.append([output(call_id, draw(texts))])
        turns.append([answer(draw(texts))])
    return turns


def render_turns(
    family: str, instructions: str | None, turns: Sequence[list[Item]]
) -> tuple[list[list[int]], int]:
    """Render turn by turn as the core does: each render from the previous one's memo.
    Returns the token lists after each turn and how many turns broke the prefix."""
    rendering = renderer(family)
    memo = None
    items: list[Item] = []
    results: list[list[int]] = []
    breaks = 0
    for turn in turns:
        items += turn
        tokens, memo, _ = rendering.render_whole(instructions, [WEATHER], items, memo)
        if results and common_prefix(tokens, _array(results[-1])) < len(results[-1]):
            breaks += 1
        results.append(list(tokens))
    return results, breaks


def _array(tokens: list[int]) -> Any:
    from array import array

    return array("I", tokens)


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=40, deadline=None)
@given(turns=agent_turns(), instructions=st.one_of(st.none(), texts))
def test_incremental_render_equals_a_fresh_render(
    family: str, turns: list[list[Item]], instructions: str | None
) -> None:
    rendering = renderer(family)
    results, _ = render_turns(family, instructions, turns)
    items: list[Item] = []
    for turn, tokens in zip(turns, results, strict=True):
        items += turn
        fresh = rendering.render_text(instructions, [WEATHER], items)
        assert tokens == rendering.tokenizer.encode(fresh)


def thought(text: str) -> Item:
    return cast(Item, {"type": "reasoning", "summary": [{"type": "summary_text", "text": text}]})


def agent_loop(rounds: int) -> list[list[Item]]:
    """User, [reasoning, call], output, [reasoning, answer]: ``rounds`` times."""
    turns: list[list[Item]] = []
    for index in range(rounds):
        turns += [[user(f"Step {index}: what is the weather?")]]
        turns += [[thought("Ask the tool."), call(f"c{index}")], [output(f"c{index}")]]
        turns += [[thought("Answer."), answer("Sunny, 21 degrees.")]]
    return turns


def test_prefix_stability_report() -> None:
    """How often each family renders earlier turns anew, over a 10-round agent loop (40
    turns): the figures docs/real-inference.md reports."""
    turns = agent_loop(10)
    report = {family: render_turns(family, "Be brief.", turns)[1] for family in FAMILIES}
    # ChatML and Llama 3 only append. Mistral moves tools and the system prompt to the last
    # user message, and Qwen 3 drops the reasoning of earlier rounds: every user message after
    # the first renders earlier turns anew (9 of 39 turn changes). Tool rounds never do.
    assert report == {"chatml": 0, "llama3": 0, "mistral": 9, "qwen3": 9}


# -- tool calls --------------------------------------------------------------------------------


def parse(
    text: str,
    style: str = "tags",
    *,
    stop: bool = True,
    tools: bool = True,
    syntax: ToolCallSyntax | None = None,
) -> list[EngineEvent]:
    model = tokenizer()
    stops = [model.token_id("<|im_end|>") or 0]
    syntax = syntax or ToolCallSyntax(style=cast(Any, style), think_open="<think>")
    parser = TemplateCompletionParser(model, syntax, stops, tools=tools)
    events: list[EngineEvent] = []
    for token in model.encode(text) + (stops if stop else []):
        events += parser.feed(token)
    events += parser.close()
    # Only the model's own stop ends its turn; a stream that just ends does not.
    assert parser.finished == stop
    return events


def items_of(events: list[EngineEvent]) -> list[tuple[str, str, str, int]]:
    """(kind, name, text, deltas) per item."""
    found: list[tuple[str, str, str, int]] = []
    for event in events:
        if isinstance(event, ItemStart):
            found.append((event.kind, event.name, "", 0))
        elif isinstance(event, Delta):
            kind, name, text, count = found[-1]
            found[-1] = (kind, name, text + event.text, count + 1)
        elif isinstance(event, ItemEnd):
            assert not event.incomplete
    return found


def test_calls_in_tags_stream_their_arguments() -> None:
    arguments = '{"city": "Paris", "days": [1, 2], "note": "a } in \\" text"}'
    events = parse(
        "Let me check.\n<tool_call>\n"
        f'{{"name": "get_weather", "arguments": {arguments}}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    )
    assert [(k, n, t) for k, n, t, _ in items_of(events)] == [
        ("message", "", "Let me check.\n"),
        ("function_call", "get_weather", arguments),
        ("function_call", "get_time", "{}"),
    ]
    assert items_of(events)[1][3] > 5  # streamed in pieces as the tokens came


def test_a_tag_split_over_tokens_is_still_found() -> None:
    syntax = ToolCallSyntax(style="tags", open_tag="<function=call>", close_tag="</function>")
    events = parse(
        'Hi <function=call>{"name": "f", "arguments": {"a": 1}}</function>', syntax=syntax
    )
    assert [(k, n, t) for k, n, t, _ in items_of(events)] == [
        ("message", "", "Hi "),
        ("function_call", "f", '{"a": 1}'),
    ]


def test_bare_json_calls() -> None:
    single = parse('{"name": "get_weather", "parameters": {"city": "Paris"}}', "json")
    assert [(k, n, t) for k, n, t, _ in items_of(single)] == [
        ("function_call", "get_weather", '{"city": "Paris"}')
    ]
    many = parse(
        '[{"name": "a", "arguments": {}}, {"name": "b", "arguments": "{\\"x\\": 1}"}]', "json"
    )
    assert [(k, n, t) for k, n, t, _ in items_of(many)] == [
        ("function_call", "a", "{}"),
        ("function_call", "b", '{"x": 1}'),
    ]
    separated = parse('{"name": "a", "parameters": {}}; {"name": "b", "parameters": {}}', "json")
    assert [n for _, n, _, _ in items_of(separated)] == ["a", "b"]
    # Without tools, or when the answer is prose or JSON that is no call, it stays text.
    for tools in (False, True):
        assert items_of(parse('{"answer": 42}', "json", tools=tools))[0][:3] == (
            "message",
            "",
            '{"answer": 42}',
        )
    assert items_of(parse("Sunny.", "json"))[0][:3] == ("message", "", "Sunny.")


def test_reasoning_in_think_tags() -> None:
    events = parse("<think>The user wants weather.</think>\n\nIt is sunny.")
    assert [(k, t) for k, _, t, _ in items_of(events)] == [
        ("reasoning", "The user wants weather."),
        ("message", "It is sunny."),
    ]


@pytest.mark.parametrize(
    ("text", "style", "reason"),
    [
        ('<tool_call>\n{"name": "f", "arguments": {"a": }\n</tool_call>', "tags", "not JSON"),
        ('<tool_call>\n{"arguments": {}}\n</tool_call>', "tags", "no 'name'"),
        ('<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>', "tags", "not a JSON object"),
        ('<tool_call>\n{"name": "f", "arguments": {}}', "tags", "no closing </tool_call>"),
        ('{"name": "f", "parameters": {"a": 1}} trailing', "json", "not JSON"),
        ('{"name": "f", "parameters": {"a": 1}', "json", "not JSON"),
    ],
)
def test_malformed_calls_fail_clearly(text: str, style: str, reason: str) -> None:
    with pytest.raises(EngineError, match=reason) as caught:
        parse(text, style)
    assert caught.value.code == "engine_bad_response"


def test_a_call_cut_short_ends_incomplete() -> None:
    events = parse('<tool_call>\n{"name": "f", "arguments": {"city": "Pa', stop=False)
    assert isinstance(events[0], ItemStart) and events[0].name == "f"
    assert isinstance(events[-1], ItemEnd) and events[-1].incomplete


# -- the route's config ------------------------------------------------------------------------


async def test_a_template_route_loads_from_toml_and_builds_its_requests(tmp_path: Path) -> None:
    write_model_dir(tmp_path / "models" / "qwen", "chatml")
    toml = tmp_path / "server.toml"
    toml.write_text(
        "[models.qwen]\n"
        'engine = "completions"\n'
        "[models.qwen.completions]\n"
        'base_url = "http://127.0.0.1:1/v1"\n'
        'format = "template"\n'
        'tokenizer = "models/qwen"\n'  # relative to the config file
        "chat_template_kwargs = { enable_thinking = false }\n"
    )
    route = load_config(toml).models["qwen"]
    engine = build_engine("completions", completions=route.completions)
    assert isinstance(engine, CompletionsEngine)
    try:
        assert engine.renderer.format_name.startswith("template:tokenizer.json:")
        model = tokenizer()
        schema: JSONObject = {
            "type": "object",
            "properties": {"zeta": {"type": "string"}, "alpha": {"type": "number"}},
        }
        request = EngineRequest(
            prompt_tokens=[1, 2],
            tools=(),
            tool_choice="none",
            response_format={"type": "json_schema", "name": "out", "schema": schema},
        )
        body = engine._body(request, [1, 2])
        assert body["stop_token_ids"] == list(chat_format("chatml").stop_token_ids)
        # tool_choice "none": the model cannot open a call.
        assert body["logit_bias"] == {str(model.token_id("<tool_call>")): -100}
        response_format = cast(dict[str, Any], body["response_format"])
        assert list(response_format["json_schema"]["schema"]["properties"]) == ["zeta", "alpha"]
    finally:
        await engine.aclose()


def test_bad_template_settings_say_why(tmp_path: Path) -> None:
    files = str(model_dir("chatml"))
    with pytest.raises(ValueError, match="unknown tool_call_format 'xml'"):
        build_template_format(TemplateSettings(files, tool_call_format="xml"), load_encoding())
    with pytest.raises(ValueError, match="chat_template: no such file"):
        build_template_format(
            TemplateSettings(files, chat_template=str(tmp_path / "x.jinja")), load_encoding()
        )
    (tmp_path / "tokenizer.json").write_text((model_dir("chatml") / "tokenizer.json").read_text())
    with pytest.raises(ValueError, match="carries no chat template"):
        build_template_format(TemplateSettings(str(tmp_path)), load_encoding())


def test_a_forced_call_opens_in_the_prompt_and_the_model_writes_the_arguments() -> None:
    model = tokenizer()
    chatml = chat_format("chatml")
    request = EngineRequest(prompt_tokens=[], tools=(), forced_function="get_weather")
    parser = chatml.parser_for(request)
    events: list[EngineEvent] = []
    end = model.token_id("<|im_end|>") or 0
    sampled = [*model.encode('{"city": "Paris"}}\n</tool_call>'), end]
    for token in [*chatml.call_header("get_weather"), *sampled]:
        events += parser.feed(token)
    assert [(k, n, t) for k, n, t, _ in items_of(events)] == [
        ("function_call", "get_weather", '{"city": "Paris"}')
    ]
    assert parser.finished and parser.last_kind == "function_call"


def test_a_gguf_vocabulary_reads_as_its_tokenizer_json(tmp_path: Path) -> None:
    import gguf

    from tests.llama.open_gguf import open_tokenizer, write_open_model

    path = write_open_model(tmp_path / "open.gguf")
    from_gguf = load_model_tokenizer(path)
    reference = open_tokenizer()
    text = "<|im_start|>user\nÜber 東京, it's 12345!\n\n  <tool_call>{}</tool_call><|im_end|>"
    assert from_gguf.encode(text) == reference.encode(text, add_special_tokens=False).ids
    assert from_gguf.chat_template.startswith("{%- if tools %}")
    assert from_gguf.eos_token == "<|im_end|>"
    # A vocabulary that cannot be read says which field of which file.
    for kind, message in [
        ("llama", r"tokenizer\.ggml\.tokens, \.scores or \.token_type is missing"),
        ("bert", r"tokenizer\.ggml\.model is 'bert'; only byte-level BPE"),
    ]:
        odd = gguf.GGUFWriter(str(tmp_path / f"{kind}.gguf"), "llama")
        odd.add_tokenizer_model(kind)
        odd.add_token_list(["<unk>", "<s>", "</s>"])
        odd.write_header_to_file()
        odd.write_kv_data_to_file()
        odd.write_tensors_to_file()
        odd.close()
        with pytest.raises(TokenizerLoadError, match=message) as failed:
            load_model_tokenizer(tmp_path / f"{kind}.gguf")
        assert str(tmp_path / f"{kind}.gguf") in str(failed.value)


def test_control_tokens_are_structure_and_added_text_tokens_are_text() -> None:
    model = tokenizer()
    syntax = ToolCallSyntax(style="json")
    parser = TemplateCompletionParser(model, syntax, [model.token_id("</s>") or 0])
    events: list[EngineEvent] = []
    # Mistral: [TOOL_CALLS] (a control token) opens a JSON list of calls.
    text = '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]</s>'
    for token in model.encode(text):
        events += parser.feed(token)
    assert [(k, n, t) for k, n, t, _ in items_of(events)] == [
        ("function_call", "get_weather", '{"city": "Paris"}')
    ]
    # <tool_call> is an added token but not a control one: outside the tags style it is text.
    none = ToolCallSyntax(style="none")
    parser = TemplateCompletionParser(model, none, [model.token_id("<|im_end|>") or 0])
    events = []
    for token in model.encode("Use <tool_call> tags.<|im_end|>"):
        events += parser.feed(token)
    assert items_of(events)[0][:3] == ("message", "", "Use <tool_call> tags.")


@pytest.mark.parametrize("family", ["chatml", "llama3"])
def test_a_tokenizer_that_adds_bos_starts_the_prompt_with_it_once(
    tmp_path: Path, family: str
) -> None:
    files = write_model_dir(tmp_path / family, family)
    config_path = files / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config.update(bos_token=config["bos_token"] or "<s>", add_bos_token=True)
    config_path.write_text(json.dumps(config), encoding="utf-8")
    fmt = build_template_format(TemplateSettings(str(files)), load_encoding())
    assert isinstance(fmt.renderer, TemplateRenderer)
    model = fmt.renderer.tokenizer
    bos = model.token_id(config["bos_token"])
    tokens = list(fmt.renderer.render_conversation(None, [], [user("Hi")]))
    # ChatML does not write it: the tokenizer adds it. Llama 3's template writes it: once.
    assert tokens[0] == bos and tokens.count(bos) == 1
