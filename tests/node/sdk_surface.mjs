// Drives a running server with the official openai Node SDK and prints what it saw as one
// JSON object; tests/node/test_node_sdk.py starts the server and checks the result.
//
//   node sdk_surface.mjs http://127.0.0.1:PORT/v1 [streamed-model] [endless-model]
// The background part streams a response of the first model to its end, and cancels one of
// the second (which must still be running when it is cancelled).
import OpenAI from "openai";

const [baseURL, slowModel = "sim-model", endlessModel = slowModel] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "test", maxRetries: 0, timeout: 20_000 });
const result = {};

const SHELL = {
  type: "function",
  name: "exec_command",
  description: "Run a shell command.",
  parameters: {
    type: "object",
    properties: { cmd: { type: "string" } },
    required: ["cmd"],
    additionalProperties: false,
  },
  strict: false,
};

async function poll(id, wanted) {
  const deadline = Date.now() + 15_000;
  for (;;) {
    const response = await client.responses.retrieve(id);
    if (wanted.includes(response.status)) return response;
    if (Date.now() > deadline) throw new Error(`status stuck at ${response.status}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

// compact, then continue from the compacted items
const first = await client.responses.create({ model: "sim-model", input: "fix it", tools: [SHELL] });
const call = first.output[0];
const second = await client.responses.create({
  model: "sim-model",
  tools: [SHELL],
  previous_response_id: first.id,
  input: [{ type: "function_call_output", call_id: call.call_id, output: "ok" }],
});
const compacted = await client.responses.compact({
  model: "sim-model",
  previous_response_id: second.id,
});
const follow = await client.responses.create({
  model: "sim-model",
  tools: [SHELL],
  input: [...compacted.output, { role: "user", content: "go on" }],
});
result.compact = {
  object: compacted.object,
  types: compacted.output.map((item) => item.type),
  usage: compacted.usage,
  follow_status: follow.status,
};
try {
  await client.responses.compact({ input: "no model" });
  result.compact.missing_model = "accepted";
} catch (error) {
  result.compact.missing_model = { status: error.status, param: error.param, code: error.code };
}

// input_tokens.count equals the usage of the same create
const body = { model: "sim-model", input: "count me", tools: [SHELL], instructions: "Be brief." };
const counted = await client.responses.inputTokens.count(body);
const created = await client.responses.create(body);
result.input_tokens = {
  object: counted.object,
  counted: counted.input_tokens,
  used: created.usage.input_tokens,
};

// models
const models = [];
for await (const model of client.models.list()) models.push(model.id);
const one = await client.models.retrieve("sim-model");
let unknown;
try {
  await client.models.retrieve("nope");
} catch (error) {
  unknown = error.status;
}
result.models = { ids: models, retrieved: one.id, owned_by: one.owned_by, unknown };

// responses.parse with a JSON schema format
const parsed = await client.responses.parse({
  model: "sim-model",
  input: "a point",
  text: {
    format: {
      type: "json_schema",
      name: "point",
      strict: true,
      schema: {
        type: "object",
        properties: { x: { type: "integer", minimum: 0 }, label: { type: "string" } },
        required: ["x", "label"],
        additionalProperties: false,
      },
    },
  },
});
result.parse = { parsed: parsed.output_parsed, format: parsed.text.format.type };

// background: create, poll, cancel
const queued = await client.responses.create({
  model: endlessModel,
  input: "hi",
  background: true,
});
await poll(queued.id, ["in_progress"]);
const cancelled = await client.responses.cancel(queued.id);
result.background = {
  queued_status: queued.status,
  background: queued.background,
  cancelled: cancelled.status,
  after: (await poll(queued.id, ["cancelled"])).status,
};

// background + stream, dropped after a few events and resumed with starting_after
const stream = await client.responses.create({
  model: slowModel,
  input: "hi",
  background: true,
  stream: true,
});
const seen = [];
for await (const event of stream) {
  seen.push(event);
  if (seen.length === 5) break; // leaving the loop aborts the request
}
const resumed = await client.responses.retrieve(seen[0].response.id, {
  stream: true,
  starting_after: seen.at(-1).sequence_number,
});
const rest = [];
for await (const event of resumed) rest.push(event);
const all = [...seen, ...rest];
result.resume = {
  numbers: all.map((event) => event.sequence_number),
  last: rest.at(-1).type,
  text_matches:
    all
      .filter((event) => event.type === "response.output_text.delta")
      .map((event) => event.delta)
      .join("") ===
    rest
      .at(-1)
      .response.output.filter((item) => item.type === "message")
      .flatMap((item) => item.content)
      .map((part) => part.text)
      .join(""),
};

console.log(JSON.stringify(result));
