// The `application/grpc-web-text` half of e2e/grpc-web-test.sh: grpc/grpc-web's own client
// (the npm package grpc-web, what protoc-gen-grpc-web's generated code calls) in its text
// mode, the base64 form XMLHttpRequest-based browser clients send, calling
// grpc.health.v1.Health through Tollgate. Node has no XMLHttpRequest, so xhr2 (an
// XMLHttpRequest on Node's http module) stands in for the browser's. The method descriptors
// are written out here (protoc-gen-grpc-web is a native binary, not on npm), with
// @bufbuild/protobuf encoding the messages from the code buf generated.
//
//   node text-client.mjs BASE_URL
//
// Checks, as client.mjs's: Check("") is SERVING; Watch("ticker") yields 6 messages alternating
// SERVING / NOT_SERVING, then OUT_OF_RANGE "ticker: 6 updates sent"; Check("no.such.Service")
// is NOT_FOUND; requests and answers are `application/grpc-web-text`. Any mismatch prints
// "FAIL: ..." and exits 1.
import XMLHttpRequest from "xhr2";
import grpcWeb from "grpc-web";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import {
  HealthCheckRequestSchema,
  HealthCheckResponseSchema,
  HealthCheckResponse_ServingStatus as Status,
} from "./gen/grpc/health/v1/health_pb.js";

// grpc-web creates its XMLHttpRequest per call, from the global a browser has. This one
// keeps each request, so the content types sent and answered can be read after the call
// (grpc-web hands its callers no content-type).
const requests = [];
class ObservedXMLHttpRequest extends XMLHttpRequest {
  constructor() {
    super();
    this.sentContentType = undefined;
    requests.push(this);
  }
  setRequestHeader(name, value) {
    if (name.toLowerCase() === "content-type") this.sentContentType = value;
    super.setRequestHeader(name, value);
  }
}
globalThis.XMLHttpRequest = ObservedXMLHttpRequest;
const { GrpcWebClientBase, MethodDescriptor, MethodType, StatusCode } = grpcWeb;

const [baseUrl] = process.argv.slice(2);
if (!baseUrl) {
  console.error("usage: node text-client.mjs BASE_URL");
  process.exit(2);
}
const TICKER_UPDATES = 6;
// What the request is sent as and its answer must come back as.
const TYPES = "application/grpc-web-text -> application/grpc-web-text";
const NAME = "grpc-web (text, XMLHttpRequest)";

class Mismatch extends Error {}
function expect(cond, what) {
  if (!cond) throw new Mismatch(`${NAME} ${what}`);
}

// grpc-web wants message classes; the (de)serializers do the work, so empty ones do.
class Request {}
class Response {}
function method(name, type) {
  return new MethodDescriptor(
    `/grpc.health.v1.Health/${name}`,
    type,
    Request,
    Response,
    (req) => toBinary(HealthCheckRequestSchema, req),
    (bytes) => fromBinary(HealthCheckResponseSchema, bytes),
  );
}
const check = method("Check", MethodType.UNARY);
const watch = method("Watch", MethodType.SERVER_STREAMING);
const client = new GrpcWebClientBase({ format: "text" });

// One call to its end: the messages, the final status (code 0 or the error), and the
// content types of its request and answer ("sent -> answered").
async function call(desc, service) {
  const before = requests.length;
  const url = `${baseUrl}${desc.getName()}`;
  const req = create(HealthCheckRequestSchema, { service });
  const { messages, status } = await new Promise((resolve) => {
    const messages = [];
    if (desc === check) {
      client.rpcCall(url, req, {}, desc, (err, res) => {
        if (res) messages.push(res);
        resolve({ messages, status: err ?? { code: StatusCode.OK } });
      });
      return;
    }
    const stream = client.serverStreaming(url, req, {}, desc);
    stream.on("data", (m) => messages.push(m));
    stream.on("error", (err) => resolve({ messages, status: err }));
    stream.on("end", () => resolve({ messages, status: { code: StatusCode.OK } }));
  });
  expect(requests.length === before + 1, `${desc.getName()}: wanted one XMLHttpRequest, saw ${requests.length - before}`);
  const x = requests[before];
  return { messages, status, types: `${x.sentContentType} -> ${x.getResponseHeader("content-type")}` };
}

try {
  const up = await call(check, "");
  expect(up.status.code === StatusCode.OK, `Check(""): status ${up.status.code} ${up.status.message}`);
  expect(up.messages.length === 1 && up.messages[0].status === Status.SERVING, `Check(""): not SERVING`);
  expect(up.types === TYPES, `Check(""): content types ${up.types}, wanted ${TYPES}`);
  console.log(`ok   ${NAME}: unary Check("") = SERVING, ${up.types}`);

  const ticks = await call(watch, "ticker");
  const statuses = ticks.messages.map((m) => m.status);
  expect(
    statuses.length === TICKER_UPDATES,
    `Watch("ticker"): wanted ${TICKER_UPDATES} messages, got ${statuses.map((s) => Status[s])}`,
  );
  for (let i = 0; i < statuses.length; i++) {
    expect(
      statuses[i] === Status.SERVING || statuses[i] === Status.NOT_SERVING,
      `Watch("ticker"): message ${i} is ${Status[statuses[i]]}`,
    );
    expect(i === 0 || statuses[i] !== statuses[i - 1], `Watch("ticker"): messages ${i - 1} and ${i} are equal`);
  }
  expect(
    ticks.status.code === StatusCode.OUT_OF_RANGE && ticks.status.message === `ticker: ${TICKER_UPDATES} updates sent`,
    `Watch("ticker"): wanted OUT_OF_RANGE "ticker: ${TICKER_UPDATES} updates sent", got ${ticks.status.code} "${ticks.status.message}"`,
  );
  expect(ticks.types === TYPES, `Watch("ticker"): content types ${ticks.types}, wanted ${TYPES}`);
  console.log(
    `ok   ${NAME}: server-streaming Watch("ticker") = ${statuses.map((s) => Status[s]).join(",")}, then OUT_OF_RANGE "${ticks.status.message}", ${ticks.types}`,
  );

  const missing = await call(check, "no.such.Service");
  expect(
    missing.status.code === StatusCode.NOT_FOUND,
    `Check("no.such.Service"): wanted NOT_FOUND, got ${missing.status.code} "${missing.status.message}"`,
  );
  expect(missing.types === TYPES, `Check("no.such.Service"): content types ${missing.types}, wanted ${TYPES}`);
  console.log(`ok   ${NAME}: unary Check("no.such.Service") = NOT_FOUND "${missing.status.message}", ${missing.types}`);
} catch (e) {
  console.error(e instanceof Mismatch ? `FAIL: ${e.message}` : `FAIL: ${e?.stack ?? e}`);
  process.exit(1);
}
console.log("all gRPC-Web text checks passed");
