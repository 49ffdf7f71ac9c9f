// An MCP client of the TypeScript SDK, for the tests: node client.mjs KEY URL[,URL…] CALLS_JSON
// connects (one session; requests go to the URLs in turn), lists the tools, makes each call
// ({"name", "arguments"}) and prints {"session", "tools", "results"} as JSON.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [key, urls, callsJSON] = process.argv.slice(2);
const bases = urls.split(",").map((u) => new URL(u));
let n = 0;
const hosts = [];
// Each request to the next gateway: one session across replicas.
const fetchTurns = (input, init) => {
  const url = new URL(input instanceof Request ? input.url : input);
  const base = bases[n++ % bases.length];
  url.host = base.host;
  hosts.push(url.host);
  return fetch(url, init);
};
const transport = new StreamableHTTPClientTransport(bases[0], {
  requestInit: { headers: { Authorization: `Bearer ${key}` } },
  fetch: fetchTurns,
});
const client = new Client({ name: "hermes-test-ts", version: "1.0.0" });
await client.connect(transport);
const tools = (await client.listTools()).tools.map((t) => t.name);
const results = [];
for (const call of JSON.parse(callsJSON)) {
  results.push(await client.callTool({ name: call.name, arguments: call.arguments }));
}
console.log(JSON.stringify({ session: transport.sessionId, hosts: [...new Set(hosts)].length, tools, results }));
await client.close();
