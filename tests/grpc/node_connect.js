// A stock grpc-js client of Connect, with the proto loaded at run time (no project code):
// one turn, optionally asking for batched events. Prints what arrived as one JSON line.
"use strict";
const grpc = require("@grpc/grpc-js");
const loader = require("@grpc/proto-loader");

const [target, protoRoot, batch] = process.argv.slice(2);
const definition = loader.loadSync("bidi_responses/v1/responses.proto", {
  includeDirs: [protoRoot],
  keepCase: true,
  longs: Number,
  enums: String,
  defaults: false,
  oneofs: true,
});
const v1 = grpc.loadPackageDefinition(definition).bidi_responses.v1;
const client = new v1.ResponsesService(target, grpc.credentials.createInsecure());
const call = client.Connect();
const seen = { messages: 0, batches: 0, types: [], sequence: [] };
const terminal = new Set(["response_completed", "response_failed", "response_incomplete", "error"]);

call.on("data", (message) => {
  seen.messages += 1;
  // The only change a batching client needs: a batch is a list of ordinary events.
  const events = message.event === "batch" ? message.batch.events : [message];
  if (message.event === "batch") seen.batches += 1;
  for (const event of events) {
    seen.types.push(event.event);
    const body = event[event.event];
    seen.sequence.push(body.sequence_number === undefined ? 0 : body.sequence_number);
    if (terminal.has(event.event)) call.end();
  }
});
call.on("error", (error) => {
  console.error(String(error));
  process.exit(1);
});
call.on("end", () => {
  console.log(JSON.stringify(seen));
  client.close();
});
const request = {
  response_create: {
    model: "sim-model",
    input: [{ message: { role: "user", content: [{ input_text: { text: "hi" } }] } }],
  },
};
if (batch === "batch") request.delivery = { batch_events: true };
call.write(request);
