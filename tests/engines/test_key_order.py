"""What the client wrote reaches the model as written: tool parameters and ``text.format``
schemas keep the client's key order in the prompt (canonical, sorted forms are for
fingerprints only), as openai-harmony's own renderer keeps it."""

from __future__ import annotations

import openai_harmony as oh
from bidi_responses.schema import JSONObject
from bidi_responses.server.config import Limits
from bidi_responses.server.core.api.requests import parse_create
from bidi_responses.server.core.rendering.tokenizer import load_encoding
from bidi_responses.server.engines.harmony import HarmonyRenderer, developer_message, load_harmony

# Keys deliberately out of alphabetical order, nested too.
PARAMETERS: JSONObject = {
    "type": "object",
    "properties": {
        "zeta": {"type": "string", "description": "last letter first"},
        "alpha": {"type": "integer"},
        "middle": {
            "type": "object",
            "properties": {"y": {"type": "string"}, "b": {"type": "number"}},
        },
    },
    "required": ["zeta", "alpha"],
}
TOOL: JSONObject = {
    "type": "function",
    "name": "lookup",
    "description": "Look something up.",
    "parameters": PARAMETERS,
}


def test_harmony_tools_keep_the_clients_key_order() -> None:
    renderer = HarmonyRenderer(load_encoding())
    ours = list(renderer.render_prefix("Be brief.", [TOOL]))
    harmony = load_harmony()
    tool = oh.ToolDescription.new("lookup", "Look something up.", PARAMETERS)
    developer = developer_message("Be brief.", [tool])
    assert developer is not None
    system = oh.Message.from_role_and_content(oh.Role.SYSTEM, oh.SystemContent.new())
    theirs = harmony.render_conversation(oh.Conversation.from_messages([system, developer]))
    assert ours == theirs
    text = harmony.decode(ours)
    assert text.index("zeta") < text.index("alpha") < text.index("middle")


def test_output_schema_keeps_the_clients_key_order() -> None:
    body = {
        "model": "m",
        "input": "hi",
        "text": {
            "format": {
                "type": "json_schema",
                "name": "answer",
                "schema": {
                    "type": "object",
                    "properties": {"zeta": {"type": "string"}, "alpha": {"type": "number"}},
                    "required": ["zeta", "alpha"],
                },
            }
        },
    }
    fmt = parse_create(body, Limits()).output_format()
    assert fmt is not None
    schema = fmt["schema"]
    assert isinstance(schema, dict) and isinstance(schema["properties"], dict)
    assert list(schema["properties"]) == ["zeta", "alpha"]
    text = load_harmony().decode(
        list(HarmonyRenderer(load_encoding()).render_prefix(None, [], fmt))
    )
    assert text.index('"zeta"') < text.index('"alpha"')
