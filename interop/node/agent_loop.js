// A chained agent loop on one Connect stream, from Node with @grpc/grpc-js and
// @grpc/proto-loader (dynamic stubs from the proto; nothing generated).
//
//   node interop/node/agent_loop.js HOST:PORT [TURNS]
//
// Each turn sends only the new input with previous_response_id; the server
// reuses the stream's cached state, so usage.input_tokens_details.cached_tokens
// must grow turn after turn. Prints one JSON line per turn and exits non-zero
// if the loop fails or the cache does not grow.
//
// Mapping notes: google.protobuf.Struct (tool parameters) is a message of
// typed values in proto-loader, converted below; int64 fields arrive as
// strings (longs: String) and are read with BigInt, never through a lossy
// float.
"use strict";

const path = require("path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const PROTO = path.join(__dirname, "..", "..", "protos", "bidi_responses", "v1", "responses.proto");

function toValue(v) {
  if (v === null) return { nullValue: "NULL_VALUE" };
  if (Array.isArray(v)) return { listValue: { values: v.map(toValue) } };
  switch (typeof v) {
    case "string": return { stringValue: v };
    case "number": return { numberValue: v };
    case "boolean": return { boolValue: v };
    default: return { structValue: toStruct(v) };
  }
}

function toStruct(obj) {
  const fields = {};
  for (const [k, v] of Object.entries(obj)) fields[k] = toValue(v);
  return { fields };
}

const SHELL = {
  function: {
    name: "exec_command",
    description: "Run a shell command.",
    parameters: toStruct({
      type: "object",
      properties: { cmd: { type: "string" } },
      required: ["cmd"],
    }),
  },
};

async function main() {
  const target = process.argv[2];
  const turns = Number(process.argv[3] || 4);
  if (!target) throw new Error("usage: agent_loop.js HOST:PORT [TURNS]");
  const definition = protoLoader.loadSync(PROTO, {
    keepCase: true, longs: String, enums: String, defaults: true, oneofs: true,
  });
  const v1 = grpc.loadPackageDefinition(definition).bidi_responses.v1;
  const client = new v1.ResponsesService(target, grpc.credentials.createInsecure());
  const metadata = new grpc.Metadata();
  if (process.env.API_KEY) metadata.set("authorization", `Bearer ${process.env.API_KEY}`);
  const call = client.Connect(metadata);

  // Events of the current turn are handed to whoever waits for the terminal one.
  let pending = null;
  let output = [];
  call.on("data", (message) => {
    const kind = message.event;
    if (kind === "response_output_item_done") output.push(message.response_output_item_done.item);
    if (kind === "error") pending.reject(new Error(JSON.stringify(message.error.error)));
    if (kind === "response_completed" || kind === "response_incomplete" || kind === "response_failed") {
      pending.resolve(message[kind].response);
    }
  });
  call.on("error", (error) => { if (pending) pending.reject(error); });

  function turn(params) {
    output = [];
    return new Promise((resolve, reject) => {
      pending = { resolve, reject };
      call.write({ response_create: { model: "sim-model", tools: [SHELL], ...params } });
    });
  }

  let previous = null;
  let lastCached = -1n;
  let input = [{ message: { role: "user", content: [{ input_text: { text: "Fix the failing test." } }] } }];
  for (let i = 0; i < turns; i++) {
    const response = await turn({ input, ...(previous ? { previous_response_id: previous } : {}) });
    if (response.status !== "completed") throw new Error(`turn ${i}: ${response.status}`);
    const cached = BigInt(response.usage.input_tokens_details.cached_tokens);
    console.log(JSON.stringify({
      turn: i, id: response.id, input_tokens: response.usage.input_tokens,
      cached_tokens: cached.toString(),
    }));
    if (i > 0 && cached <= lastCached) throw new Error(`cached_tokens did not grow: ${lastCached} -> ${cached}`);
    lastCached = cached;
    previous = response.id;
    const calls = output.filter((item) => item.item === "function_call");
    input = calls.length
      ? calls.map((item) => ({
          function_call_output: { call_id: item.function_call.call_id, output: "ok: 1 passed" },
        }))
      : [{ message: { role: "user", content: [{ input_text: { text: "Next step." } }] } }];
  }
  call.end();
  client.close();
  console.log(JSON.stringify({ ok: true, turns }));
}

main().catch((error) => {
  console.error(error.stack || String(error));
  process.exit(1);
});
