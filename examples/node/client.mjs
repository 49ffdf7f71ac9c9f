// A Hermes client in Node.js, on the official nats package: nothing of Hermes' own but the
// subjects and the JSON it documents (api/asyncapi.json).
//
//   npm ci --prefix examples/node
//   node examples/node/client.mjs [NATS_URL] [SEED_FILE] [CLIENT] [ADMIN_SEED_FILE]
//
// With hermes up running: NATS_URL nats://127.0.0.1:4222, SEED_FILE hermes-data/nats/client.nk,
// CLIENT client (the NATS user hermes up makes for external clients). Given ADMIN_SEED_FILE
// (hermes-data/nats/admin.nk; or a nats:// URL naming the admin's user and password), it also
// asks, as the operator, what a tool worker ran of the tool echo: its micro
// endpoint. It prints one JSON line per step.
import { readFileSync } from "node:fs";
import { connect, headers, nkeyAuthenticator, JSONCodec } from "nats";

const [url = "nats://127.0.0.1:4222", seedFile = "hermes-data/nats/client.nk", client = "client", adminSeed = ""] = process.argv.slice(2);
const seed = new TextEncoder().encode(readFileSync(seedFile, "utf8").trim());
// Each client may subscribe only under its own inbox prefix: _INBOX_<its name>.
const nc = await connect({ servers: url, authenticator: nkeyAuthenticator(seed), inboxPrefix: `_INBOX_${client}` });
const json = JSONCodec();
const run = `${process.pid}_${Date.now()}`;
const call = (id, args) => ({ tool_call_id: id, name: "echo", arguments: args });

// Its responses come on subjects of its own too: hermes.out.<client>.response.<session>.<request_id>.
const responses = nc.subscribe(`hermes.out.${client}.response.>`);

// 1. Fire and forget: publish a request as JSON into the clients' stream (JetStream acks it).
const published = { request_id: `node_pub_${run}`, session_id: `node_${run}`, intent: "from Node", tool_calls: [call("c1", { from: "node", how: "published" })] };
const h = headers();
h.set("Content-Type", "application/json");
const js = nc.jetstream();
const ack = await js.publish(`hermes.client.${client}.${published.session_id}`, json.encode(published), { headers: h });
console.log(JSON.stringify({ step: "published", stream: ack.stream, seq: ack.seq }));

// 2. Its response, heard on the client's own subject...
for await (const m of responses) {
  const r = json.decode(m.data);
  if (r.request_id === published.request_id) {
    console.log(JSON.stringify({ step: "heard", subject: m.subject, status: r.status }));
    break;
  }
}

// ... and read back on the micro service's endpoint response (for a client that was not listening).
let answer;
for (let i = 0; i < 100; i++) {
  const m = await nc.request(`hermes.client.${client}.svc.response`, json.encode({ request_id: published.request_id }), { timeout: 5000 });
  answer = json.decode(m.data);
  if (m.headers?.get("Nats-Service-Error-Code")) {
    if (m.headers.get("Nats-Service-Error-Code") !== "404") throw new Error(`response: ${JSON.stringify(answer)}`);
  } else if (answer.status !== "pending") {
    break;
  }
  await new Promise((r) => setTimeout(r, 100)); // not taken yet, or still running
}
console.log(JSON.stringify({ step: "fetched", response: answer }));

// 3. Request/reply: the micro service submits it and answers once it is done.
const called = { request_id: `node_req_${run}`, session_id: `node_${run}`, tool_calls: [call("c1", { from: "node", how: "called" }), call("c2", { n: 2 })] };
const reply = await nc.request(`hermes.client.${client}.svc.request`, json.encode(called), { timeout: 30000 });
console.log(JSON.stringify({ step: "called", error: reply.headers?.get("Nats-Service-Error-Code") || "", response: json.decode(reply.data) }));

// 4. Follow the session: its messages come as JSON on the client's own subject — its history,
// then each new one — until the follow's time is up (a last message says so).
const events = nc.subscribe(`hermes.out.${client}.session.${called.session_id}`);
const follow = await nc.request(`hermes.client.${client}.svc.follow`, json.encode({ session_id: called.session_id, for: "2s" }), { timeout: 5000 });
if (follow.headers?.get("Nats-Service-Error-Code")) throw new Error(`follow: ${new TextDecoder().decode(follow.data)}`);
const types = [];
for await (const m of events) {
  if (m.headers?.get("Hermes-Follow-End")) break;
  types.push(json.decode(m.data).type);
}
console.log(JSON.stringify({ step: "followed", types }));

// 5. Bad input is an error reply naming the problem.
const bad = await nc.request(`hermes.client.${client}.svc.request`, json.encode({ request_id: "node.bad", tool_calls: [] }), { timeout: 5000 });
console.log(JSON.stringify({ step: "refused", error: bad.headers?.get("Nats-Service-Error-Code") || "", body: json.decode(bad.data) }));

await nc.drain();

// 6. An operator's view: the tool workers are micro services (hermes-toolworker), each tool an
// endpoint that answers what the worker ran of it.
if (adminSeed) {
  let opts;
  if (adminSeed.startsWith("nats://")) {
    const u = new URL(adminSeed);
    opts = { servers: `${u.hostname}:${u.port}`, user: decodeURIComponent(u.username), pass: decodeURIComponent(u.password) };
  } else {
    opts = { servers: url, authenticator: nkeyAuthenticator(new TextEncoder().encode(readFileSync(adminSeed, "utf8").trim())) };
  }
  const admin = await connect(opts);
  const info = json.decode((await admin.request("$SRV.INFO.hermes-toolworker", "", { timeout: 5000 })).data);
  const echo = info.endpoints.find((e) => e.name === "echo");
  const figures = json.decode((await admin.request(echo.subject, "", { timeout: 5000 })).data);
  console.log(JSON.stringify({ step: "worker", service: info.name, endpoint: echo.subject, figures }));
  await admin.drain();
}
