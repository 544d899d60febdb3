// Runs the compiled tests with Node's test runner. Node 20 has no global WebSocket
// unless --experimental-websocket is given (Node 22 and later have it by default).
import { spawnSync } from "node:child_process";
import { readdirSync } from "node:fs";
import { join } from "node:path";

const dir = join("dist-test", "test");
const files = readdirSync(dir).filter((f) => f.endsWith(".test.js")).map((f) => join(dir, f));
const major = Number(process.versions.node.split(".")[0]);
const flags = major < 22 ? ["--experimental-websocket"] : [];
const r = spawnSync(process.execPath, [...flags, "--test", "--test-concurrency=1", ...files], {
  stdio: "inherit",
});
process.exit(r.status ?? 1);
