// The access-log half of e2e/grpc-web-test.sh: every call client.mjs made is logged as
// gRPC-Web (`grpc_web: true`) with the status the backend sent, read from the trailers the
// gateway turned into the body's last message or from a Trailers-Only head. Per client (3:
// connect-web, connect-node, grpc-web text): Check "" (0), Watch "ticker" (11,
// OUT_OF_RANGE), Check "no.such.Service" (5, NOT_FOUND); and client.mjs's CORS call Check ""
// (0). Preflights (OPTIONS) are not calls.
//
//   node access-log-check.mjs ACCESS_LOG_FILE
import { readFileSync } from "node:fs";

const lines = readFileSync(process.argv[2], "utf8")
  .split("\n")
  .filter(Boolean)
  .map((l) => JSON.parse(l));
const calls = lines.filter((l) => l.method === "POST");
const got = calls.map((l) => `${l.path} grpc_web=${l.grpc_web} grpc_status=${l.grpc_status}`).sort();
const want = [
  ...Array(4).fill("/grpc.health.v1.Health/Check grpc_web=true grpc_status=0"),
  ...Array(3).fill("/grpc.health.v1.Health/Check grpc_web=true grpc_status=5"),
  ...Array(3).fill("/grpc.health.v1.Health/Watch grpc_web=true grpc_status=11"),
].sort();
if (JSON.stringify(got) !== JSON.stringify(want)) {
  console.error(`FAIL: the access log's calls:\n  ${got.join("\n  ")}\nwanted:\n  ${want.join("\n  ")}`);
  process.exit(1);
}
console.log(`ok   access log: ${calls.length} gRPC-Web calls, each with the backend's status`);
