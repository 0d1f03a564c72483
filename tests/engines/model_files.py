# ruff: noqa: E501  (the templates keep the lines their models ship with)
"""An open model's files, made at test time: a byte-level BPE vocabulary of its own (trained
with the ``tokenizers`` library on a small corpus, nothing like o200k) and representative chat
templates of three families, written the way those models ship them:

* ``CHATML``: Qwen 2.5 style, tools in the system message, calls as JSON in ``<tool_call>``
  tags, tool outputs grouped in a user turn;
* ``LLAMA3``: Llama 3.1/3.2 style, the date in the system header (``strftime_now``), tools in
  the first user message, calls as bare JSON with ``parameters``, outputs as ``ipython``;
* ``MISTRAL``: Mistral style, tools and the system prompt on the *last* user message, calls
  after ``[TOOL_CALLS]``.
"""

from __future__ import annotations

import json
from pathlib import Path

import tokenizers
from tokenizers import Regex, decoders, models, pre_tokenizers, trainers

SPLIT = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
    r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_CALLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
]
# Added but not special, as in Qwen's vocabulary: the model writes them as text.
TAGS = ["<tool_call>", "</tool_call>"]
CORPUS = [
    "You are a helpful assistant. Hello world. What is the weather in Paris today?",
    'system user assistant tool {"name": "get_weather", "arguments": {"city": "Paris"}}',
    '{"type": "function", "function": {"name": "get_weather", "description": "Weather."}}',
    '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}}',
    "It is sunny, 21 degrees. Thanks! The weather in Paris is sunny. Über café 東京",
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n",
    "<tool_response>\n</tool_response> <tools></tools> function signatures XML tags",
    "Cutting Knowledge Date: December 2023\nToday Date: 01 Dec 2026\n\n",
    "Given the following functions, please respond with a JSON for a function call",
]

CHATML = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

LLAMA3 = """\
{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = strftime_now("%d %b %Y") %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- if tools and messages | length > 0 %}
    {%- set first_user_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

MISTRAL = """\
{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {{- tool | tojson }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
            {%- endfor %}
            {{- "][/AVAILABLE_TOOLS]" }}
        {%- endif %}
        {%- if message == user_messages[-1] and system_message is defined %}
            {{- "[INST] " + system_message + "\\n\\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message["role"] == "assistant" and message.tool_calls %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {{- {"name": tool_call.function.name, "arguments": tool_call.function.arguments} | tojson }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- endif %}
        {%- endfor %}
        {{- "]" + eos_token }}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"] + eos_token }}
    {%- elif message["role"] == "tool" %}
        {{- '[TOOL_RESULTS] {"content": ' + message.content|tojson + '}[/TOOL_RESULTS]' }}
    {%- endif %}
{%- endfor %}
"""

# Qwen 3 style: ChatML, plus reasoning in <think> tags kept only after the last user query
# (and on a final assistant message), as the Qwen 3 and DeepSeek R1 templates do.
QWEN3 = (
    CHATML.replace(
        """{%- for message in messages %}
    {%- if (message.role == "user")""",
        """{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set reasoning_content = message.reasoning_content or '' %}
    {%- if message.role == "assistant" and loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}
        {%- set think = '<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' %}
    {%- else %}
        {%- set think = '' %}
    {%- endif %}
    {%- if (message.role == "user")""",
    )
    .replace(
        """{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}""",
        """{{- '<|im_start|>' + message.role + '\\n' + think + message.content + '<|im_end|>' + '\\n' }}""",
    )
    .replace(
        """        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}""",
        """        {{- '<|im_start|>' + message.role }}
        {%- if think %}
            {{- '\\n' + think.rstrip('\\n') }}
        {%- endif %}
        {%- if message.content %}""",
    )
)

TEMPLATES = {"chatml": CHATML, "llama3": LLAMA3, "mistral": MISTRAL, "qwen3": QWEN3}
BOS = {"chatml": "", "llama3": "<|begin_of_text|>", "mistral": "<s>", "qwen3": ""}
EOS = {"chatml": "<|im_end|>", "llama3": "<|eot_id|>", "mistral": "</s>", "qwen3": "<|im_end|>"}


def train_tokenizer(vocab_size: int = 700) -> tokenizers.Tokenizer:
    """A byte-level BPE trained on ``CORPUS``, with the families' special tokens."""
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS * 4, trainer)
    tokenizer.add_tokens([tokenizers.AddedToken(tag, normalized=False) for tag in TAGS])
    return tokenizer


def write_model_dir(directory: Path, family: str) -> Path:
    """``tokenizer.json`` and ``tokenizer_config.json`` (with the family's template)."""
    directory.mkdir(parents=True, exist_ok=True)
    train_tokenizer().save(str(directory / "tokenizer.json"))
    config = {
        "bos_token": BOS[family] or None,
        "eos_token": EOS[family],
        "chat_template": TEMPLATES[family],
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return directory
