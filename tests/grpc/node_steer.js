// A stock grpc-js client of Connect, with the proto loaded at run time (no project code),
// steering a response: create on lane "a", steer it at its response_created, read the steered
// target and its automatic successor. Prints what arrived as one JSON line.
"use strict";
const grpc = require("@grpc/grpc-js");
const loader = require("@grpc/proto-loader");

const [target, protoRoot] = process.argv.slice(2);
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
const seen = { events: [], lanes: [], responses: [] };
let steered = null;

function userText(text) {
  return [{ message: { role: "user", content: [{ input_text: { text } }] } }];
}

call.on("data", (message) => {
  const events = message.event === "batch" ? message.batch.events : [message];
  for (const event of events) {
    const body = event[event.event];
    seen.events.push(event.event);
    seen.lanes.push(event.stream_id || "");
    if (event.event === "response_created" && steered === null) {
      steered = body.response.id;
      // No stream_id on a steer: the target's lane is used.
      call.write({
        response_steer: { previous_response_id: steered, input: userText("use tabs") },
      });
    }
    if (event.event === "response_steer_accepted") seen.accepted = body.steer;
    if (event.event === "response_steer_failed") seen.failed = body;
    if (["response_completed", "response_incomplete", "response_failed"].includes(event.event)) {
      const r = body.response;
      seen.responses.push({
        id: r.id,
        status: r.status,
        reason: r.incomplete_details ? r.incomplete_details.reason : null,
        previous_response_id: r.previous_response_id || null,
      });
      if (r.id !== steered) call.end(); // the successor ended
    }
    if (event.event === "error") {
      seen.error = body.error;
      call.end();
    }
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
call.write({
  stream_id: "a",
  response_create: { model: "sim-model", input: userText("write a poem") },
});
