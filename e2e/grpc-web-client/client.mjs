// The gRPC-Web client of e2e/grpc-web-test.sh: real gRPC-Web clients from npm calling
// grpc.health.v1.Health (served by extauthz-grpc, grpc-go; e2e/extauthz/health.go) through
// Tollgate's GRPCRoute, which translates gRPC-Web to gRPC for the backend.
//
//   node client.mjs BASE_URL ALLOWED_ORIGIN
//
// Two transports make the same calls: @connectrpc/connect-web's createGrpcWebTransport on
// Node's fetch (HTTP/1.1, as a browser page would), and @connectrpc/connect-node's
// createGrpcWebTransport over HTTP/2 (h2c). Both send `application/grpc-web+proto` (binary):
// neither implements `application/grpc-web-text`. For each:
//   - unary Check("") answers SERVING (the message, then `grpc-status: 0` in the body);
//   - server-streaming Watch("ticker") yields 6 messages alternating SERVING / NOT_SERVING,
//     then ends with OUT_OF_RANGE "ticker: 6 updates sent" (an error in the trailers that
//     follow the messages in the body);
//   - unary Check("no.such.Service") fails with NOT_FOUND (grpc-go's Trailers-Only answer);
//   - every answer's content-type is `application/grpc-web+proto`.
// Then the CORS side a browser needs: a preflight from ALLOWED_ORIGIN is answered with the
// Access-Control-* headers, one from another origin without them, and a call carrying
// `Origin: ALLOWED_ORIGIN` gets Access-Control-Allow-Origin and grpc-status exposed.
//
// Any mismatch prints "FAIL: ..." and exits 1; success prints one "ok" line per check.
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcWebTransport as createWebTransport } from "@connectrpc/connect-web";
import { createGrpcWebTransport as createNodeTransport } from "@connectrpc/connect-node";
import { Health, HealthCheckResponse_ServingStatus as Status } from "./gen/grpc/health/v1/health_pb.js";

const [baseUrl, allowedOrigin] = process.argv.slice(2);
if (!baseUrl || !allowedOrigin) {
  console.error("usage: node client.mjs BASE_URL ALLOWED_ORIGIN");
  process.exit(2);
}
const TICKER_UPDATES = 6;
const GRPC_WEB_PROTO = "application/grpc-web+proto";

class Mismatch extends Error {}
function expect(cond, what) {
  if (!cond) throw new Mismatch(what);
}
function ok(what) {
  console.log(`ok   ${what}`);
}

// Records the content-type of every answer the transport reads (unary and streaming alike).
function contentTypes() {
  const seen = [];
  const interceptor = (next) => async (req) => {
    let res;
    try {
      res = await next(req);
    } catch (e) {
      // A unary call that failed: its answer's headers are in the error's metadata.
      seen.push(`${req.method.name}: ${ConnectError.from(e).metadata.get("content-type")}`);
      throw e;
    }
    seen.push(`${req.method.name}: ${res.header.get("content-type")}`);
    return res;
  };
  return { seen, interceptor };
}

async function expectError(promise, code, what) {
  try {
    await promise;
  } catch (e) {
    const err = ConnectError.from(e);
    expect(err.code === code, `${what}: wanted ${Code[code]}, got ${Code[err.code]} (${err.rawMessage})`);
    return err;
  }
  throw new Mismatch(`${what}: wanted ${Code[code]}, the call succeeded`);
}

async function checkTransport(name, makeTransport) {
  const types = contentTypes();
  const client = createClient(Health, makeTransport([types.interceptor]));

  const up = await client.check({ service: "" });
  expect(up.status === Status.SERVING, `${name} Check(""): wanted SERVING, got ${Status[up.status]}`);
  ok(`${name}: unary Check("") = SERVING`);

  const statuses = [];
  const end = await expectError(
    (async () => {
      for await (const m of client.watch({ service: "ticker" })) statuses.push(m.status);
    })(),
    Code.OutOfRange,
    `${name} Watch("ticker")`,
  );
  expect(
    statuses.length === TICKER_UPDATES,
    `${name} Watch("ticker"): wanted ${TICKER_UPDATES} messages, got ${statuses.length}: ${statuses.map((s) => Status[s])}`,
  );
  for (let i = 0; i < statuses.length; i++) {
    expect(
      statuses[i] === Status.SERVING || statuses[i] === Status.NOT_SERVING,
      `${name} Watch("ticker"): message ${i} is ${Status[statuses[i]]}`,
    );
    expect(
      i === 0 || statuses[i] !== statuses[i - 1],
      `${name} Watch("ticker"): messages ${i - 1} and ${i} are both ${Status[statuses[i]]}`,
    );
  }
  expect(
    end.rawMessage === `ticker: ${TICKER_UPDATES} updates sent`,
    `${name} Watch("ticker"): wanted the message "ticker: ${TICKER_UPDATES} updates sent", got "${end.rawMessage}"`,
  );
  ok(
    `${name}: server-streaming Watch("ticker") = ${statuses.map((s) => Status[s]).join(",")}, then OUT_OF_RANGE "${end.rawMessage}"`,
  );

  const missing = await expectError(
    client.check({ service: "no.such.Service" }),
    Code.NotFound,
    `${name} Check("no.such.Service")`,
  );
  ok(`${name}: unary Check("no.such.Service") = NOT_FOUND "${missing.rawMessage}"`);

  expect(types.seen.length === 3, `${name}: wanted 3 answers seen by the interceptor, got ${types.seen}`);
  for (const t of types.seen) {
    expect(t.endsWith(`: ${GRPC_WEB_PROTO}`), `${name}: an answer's content-type is not ${GRPC_WEB_PROTO}: ${t}`);
  }
  ok(`${name}: every answer is ${GRPC_WEB_PROTO}`);
}

// A preflight as a browser sends it before a gRPC-Web call from a page on `origin`.
async function preflight(origin) {
  return fetch(`${baseUrl}/grpc.health.v1.Health/Check`, {
    method: "OPTIONS",
    headers: {
      origin,
      "access-control-request-method": "POST",
      "access-control-request-headers": "content-type,x-grpc-web,x-user-agent",
    },
  });
}

async function checkCors() {
  const res = await preflight(allowedOrigin);
  expect(res.status >= 200 && res.status < 300, `preflight from ${allowedOrigin}: HTTP ${res.status}`);
  expect(
    res.headers.get("access-control-allow-origin") === allowedOrigin,
    `preflight from ${allowedOrigin}: access-control-allow-origin is ${res.headers.get("access-control-allow-origin")}`,
  );
  const methods = (res.headers.get("access-control-allow-methods") ?? "").toLowerCase();
  expect(methods.includes("post"), `preflight: access-control-allow-methods is "${methods}"`);
  const headers = (res.headers.get("access-control-allow-headers") ?? "").toLowerCase();
  for (const h of ["content-type", "x-grpc-web", "x-user-agent"]) {
    expect(headers.includes(h), `preflight: access-control-allow-headers "${headers}" lacks ${h}`);
  }
  ok(`CORS preflight from ${allowedOrigin}: ${res.status}, allows POST and ${headers}`);

  const other = "https://elsewhere.example";
  const denied = await preflight(other);
  expect(
    denied.headers.get("access-control-allow-origin") === null,
    `preflight from ${other}: access-control-allow-origin is ${denied.headers.get("access-control-allow-origin")}`,
  );
  ok(`CORS preflight from ${other}: no access-control-allow-origin`);

  // The call itself from the allowed page: connect-web on a fetch that sends the page's Origin.
  let answer;
  const withOrigin = (input, init) => {
    const h = new Headers(init?.headers);
    h.set("origin", allowedOrigin);
    return fetch(input, { ...init, headers: h }).then((r) => {
      answer = r;
      return r;
    });
  };
  const client = createClient(Health, createWebTransport({ baseUrl, fetch: withOrigin }));
  const up = await client.check({ service: "" });
  expect(up.status === Status.SERVING, `Check("") with Origin: got ${Status[up.status]}`);
  expect(
    answer.headers.get("access-control-allow-origin") === allowedOrigin,
    `Check("") with Origin: access-control-allow-origin is ${answer.headers.get("access-control-allow-origin")}`,
  );
  const exposed = (answer.headers.get("access-control-expose-headers") ?? "").toLowerCase();
  expect(
    exposed.includes("grpc-status") && exposed.includes("grpc-message"),
    `Check("") with Origin: access-control-expose-headers is "${exposed}"`,
  );
  ok(`connect-web Check("") with Origin ${allowedOrigin}: SERVING, exposes ${exposed}`);
}

try {
  await checkTransport("connect-web (fetch, HTTP/1.1)", (interceptors) =>
    createWebTransport({ baseUrl, interceptors, defaultTimeoutMs: 10000 }),
  );
  await checkTransport("connect-node (HTTP/2)", (interceptors) =>
    createNodeTransport({ baseUrl, httpVersion: "2", interceptors, defaultTimeoutMs: 10000 }),
  );
  await checkCors();
} catch (e) {
  if (e instanceof Mismatch) {
    console.error(`FAIL: ${e.message}`);
  } else {
    console.error(`FAIL: ${e?.stack ?? e}`);
  }
  process.exit(1);
}
console.log("all gRPC-Web checks passed");
// connect-node keeps its HTTP/2 session open for a while; nothing else is pending.
process.exit(0);
