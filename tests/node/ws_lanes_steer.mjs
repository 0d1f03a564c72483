// Drives WebSocket mode with the official openai Node SDK's own classes: `ResponsesWS` for
// steering (`ws.send({type: "response.steer"})`, `ws.on("response.steer.accepted")`), and the
// lane helper `ResponsesWebSocketSession` for queued creates, forks and a steered lane. Prints
// what it saw as one JSON object; tests/node/test_node_sdk.py starts the server and checks it.
//
//   node ws_lanes_steer.mjs http://127.0.0.1:PORT/v1 MODEL
import OpenAI from "openai";
import { ResponsesWS } from "openai/resources/responses/ws";
import { ResponsesWebSocketSession } from "openai/lib/responses/responses-websocket-session";

const [baseURL, model = "sim-model"] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "test", maxRetries: 0, timeout: 20_000 });
const result = {};
const LIMITS = { maxLanes: 40, maxBufferedEvents: 10_000, maxBufferedBytes: 64 << 20 };

function summary(response) {
  return {
    id: response.id,
    status: response.status,
    reason: response.incomplete_details ? response.incomplete_details.reason : null,
    previous_response_id: response.previous_response_id ?? null,
  };
}

// A lane's next final response; a nested error event is reported with its contents.
async function final(lane) {
  try {
    return await lane.finalResponse();
  } catch (error) {
    throw new Error(`lane ${lane.streamID}: ${JSON.stringify(error.error ?? String(error))}`);
  }
}

// The lane helper sends straight to the socket, so it needs the socket open first.
function opened(ws) {
  return new Promise((resolve) => {
    if (ws.socket.readyState === 1) resolve();
    else ws.socket.on("open", resolve);
  });
}

// Resolves with the first event of `type` for which `match` holds.
function next(ws, type, match = () => true) {
  return new Promise((resolve) => {
    const handler = (event) => {
      if (!match(event)) return;
      ws.off(type, handler);
      resolve(event);
    };
    ws.on(type, handler);
  });
}

// -- steering with the raw ResponsesWS -----------------------------------------------------
{
  const ws = new ResponsesWS(client);
  const unexpected = (error) => {
    result.raw_error = String(error.message);
  };
  ws.on("error", unexpected);
  const acks = [];
  ws.on("response.steer.accepted", (event) => acks.push({ type: event.type, ...event.steer, stream_id: event.stream_id }));
  ws.on("response.steer.failed", (event) =>
    acks.push({ type: event.type, code: event.error.code, message: event.error.message, input: event.steer.input, stream_id: event.stream_id ?? null }),
  );
  const created = next(ws, "response.created");
  ws.send({ type: "response.create", model, input: "write a poem", stream_id: "s" });
  const target = (await created).response.id;
  const accepted = next(ws, "response.steer.accepted");
  const ended = next(ws, "response.incomplete", (event) => event.response.id === target);
  const successorCreated = next(ws, "response.created", (event) => event.response.previous_response_id === target);
  // A bad steer first (a tool output is no steering input), then a good one.
  const refused = next(ws, "response.steer.failed");
  ws.send({
    type: "response.steer",
    previous_response_id: target,
    input: [{ type: "function_call_output", call_id: "c1", output: "ok" }],
  });
  await refused;
  ws.send({ type: "response.steer", previous_response_id: target, input: "use tabs" });
  await accepted;
  const steered = (await ended).response;
  const successor = (await successorCreated).response;
  const successorDone = await next(ws, "response.completed", (event) => event.response.id === successor.id);
  result.steer = {
    acks,
    target: summary(steered),
    successor: summary(successorDone.response),
    successor_lane: successorDone.stream_id ?? null,
  };
  // A steer for a response that is gone: refused, and the connection goes on.
  const gone = next(ws, "response.steer.failed", (event) => event.steer.previous_response_id === target);
  ws.send({ type: "response.steer", previous_response_id: target, input: "too late" });
  await gone;

  // The 33rd named lane is refused (32 lanes are already counted: "s" and 31 more).
  ws.off("error", unexpected);
  const warmed = [];
  for (let i = 0; i < 31; i += 1) {
    const done = next(ws, "response.completed", (event) => event.stream_id === `w${i}`);
    ws.send({ type: "response.create", model, input: "warm", generate: false, store: false, stream_id: `w${i}` });
    warmed.push(done);
  }
  await Promise.all(warmed);
  const refusedLane = new Promise((resolve) => {
    ws.on("error", (error) => resolve(error.error));
  });
  ws.send({ type: "response.create", model, input: "one too many", generate: false, stream_id: "w31" });
  const error = await refusedLane;
  result.lane_limit = error.error ? error.error.code : error.code;
  ws.close();
}

// -- the lane helper: queued creates, a fork across lanes, a steered lane ------------------
{
  const ws = new ResponsesWS(client);
  ws.on("error", (error) => {
    result.helper_error = String(error.message);
  });
  await opened(ws);
  const session = new ResponsesWebSocketSession(ws, LIMITS);
  const a = session.lane("a");
  const b = session.lane("b");
  // Two creates back to back on one lane: the second waits its turn.
  a.create({ model, input: "first", store: false });
  a.create({ model, input: "second", store: false });
  const first = await final(a);
  const second = await final(a);
  // A create on lane b continuing lane a's latest (store: false) response: a fork, from the cache.
  b.create({ model, input: "fork it", previous_response_id: second.id, store: false });
  const fork = await final(b);
  result.helper = { first: summary(first), second: summary(second), fork: summary(fork) };

  // Steering through a lane: its final response is the steered target, the next its successor.
  const s = session.lane("steered");
  s.create({ model, input: "a long story" });
  let created;
  for (;;) {
    const event = await s.receive();
    if (event.type === "response.created") {
      created = event.response.id;
      break;
    }
  }
  ws.send({ type: "response.steer", previous_response_id: created, input: "make it short" });
  const steered = await final(s);
  const successor = await final(s);
  result.helper.steered = summary(steered);
  result.helper.successor = summary(successor);
  session.close();
  ws.close();
}

console.log(JSON.stringify(result));
