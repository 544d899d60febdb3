// A real im-server for the tests: `python -m im_server serve` on a free port with its
// embedded PostgreSQL, Redis and S3 in a temporary data folder; stop() and start()
// again on the same port and folder is a server restart.

import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
// dist-test/test/ -> sdk/typescript -> repository root
const pkgRoot = resolve(here, "..", "..");
const repoRoot = resolve(pkgRoot, "..", "..");

export const PYTHON = process.env.IM_PYTHON ?? resolve(pkgRoot, "../../.venv/bin/python");

const FAST_ENV: Record<string, string> = {
  IM_ARGON2_TIME_COST: "1",
  IM_ARGON2_MEMORY_KIB: "1024",
  IM_RATE_SEND_BURST: "100000",
  IM_RATE_SEND_PER_S: "100000",
  IM_RATE_READ_BURST: "100000",
  IM_RATE_READ_PER_S: "100000",
  IM_RATE_MEMBERS_BURST: "100000",
  IM_RATE_MEMBERS_PER_S: "100000",
  IM_LOGIN_FAIL_USER_MAX: "100000",
  IM_LOGIN_FAIL_ADDR_MAX: "100000",
};

function freePort(): Promise<number> {
  return new Promise((res, rej) => {
    const s = createServer();
    s.once("error", rej);
    s.listen(0, "127.0.0.1", () => {
      const addr = s.address();
      const port = typeof addr === "object" && addr ? addr.port : 0;
      s.close(() => res(port));
    });
  });
}

// a test run that dies or forgets destroy() leaves no server behind
const live = new Set<ChildProcess>();
process.once("exit", () => {
  for (const p of live) {
    try {
      if (p.pid) process.kill(-p.pid, "SIGKILL");
    } catch {
      /* gone */
    }
  }
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export class TestServer {
  proc: ChildProcess | null = null;
  readonly logPath: string;

  private constructor(
    readonly port: number,
    readonly dataDir: string,
  ) {
    this.logPath = join(dataDir, "..", `server-${port}.log`);
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  static async create(): Promise<TestServer> {
    const base = mkdtempSync(join(tmpdir(), "im-sdk-test-"));
    const s = new TestServer(await freePort(), join(base, "data"));
    await s.start();
    return s;
  }

  async start(timeoutMs = 90000): Promise<void> {
    const log = openSync(this.logPath, "a");
    this.proc = spawn(
      PYTHON,
      ["-m", "im_server", "serve", "--host", "127.0.0.1", "--port", String(this.port), "--workers", "1", "--data-dir", this.dataDir],
      {
        cwd: repoRoot,
        env: { ...process.env, ...FAST_ENV, IM_NODE_NAME: `sdk-test-${this.port}` },
        stdio: ["ignore", log, log],
        detached: true, // its own process group: stop() can end the embedded stores too
      },
    );
    const proc = this.proc;
    live.add(proc);
    proc.once("exit", () => live.delete(proc));
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      if (this.proc.exitCode !== null) throw new Error(`server exited ${this.proc.exitCode}:\n${this.logTail()}`);
      try {
        const r = await fetch(this.url + "/readyz");
        if (r.status === 200) return;
      } catch {
        /* not up yet */
      }
      await sleep(100);
    }
    throw new Error(`server not ready in ${timeoutMs} ms:\n${this.logTail()}`);
  }

  /** SIGTERM (a clean shutdown), SIGKILL of the group if it lingers. */
  async stop(timeoutMs = 30000): Promise<void> {
    const p = this.proc;
    if (!p || p.exitCode !== null || p.signalCode !== null) return;
    const exited = new Promise<void>((r) => p.once("exit", () => r()));
    p.kill("SIGTERM");
    const timer = setTimeout(() => {
      try {
        if (p.pid) process.kill(-p.pid, "SIGKILL");
      } catch {
        /* gone */
      }
    }, timeoutMs);
    await exited;
    clearTimeout(timer);
    this.proc = null;
  }

  async destroy(): Promise<void> {
    await this.stop();
    rmSync(resolve(this.dataDir, ".."), { recursive: true, force: true });
  }

  logTail(n = 40): string {
    try {
      return readFileSync(this.logPath, "utf8").split("\n").slice(-n).join("\n");
    } catch {
      return "";
    }
  }
}
