// The few platform APIs the client needs, typed here so the core compiles against
// plain ECMAScript (no DOM and no Node typings): browsers, React Native, Deno, Bun and
// Node 20+ all provide them (Node 20 has no global WebSocket: the `ws` package is loaded
// when it is installed, see platformWebSocket).

/** The part of the WHATWG WebSocket the client uses (browsers, React Native, `ws`). */
export interface WebSocketLike {
  readonly readyState: number;
  send(data: string): void;
  close(code?: number, reason?: string): void;
  onopen: ((ev: unknown) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
  onclose: ((ev: { code: number; reason?: string }) => void) | null;
  onerror: ((ev: unknown) => void) | null;
}

export type WebSocketConstructor = new (url: string) => WebSocketLike;

export interface FetchResponseLike {
  readonly status: number;
  readonly ok: boolean;
  text(): Promise<string>;
}

export interface FetchInit {
  method?: string;
  headers?: Record<string, string>;
  body?: string;
  signal?: AbortSignalLike;
}

export type FetchLike = (url: string, init?: FetchInit) => Promise<FetchResponseLike>;

export interface AbortSignalLike {
  readonly aborted: boolean;
}

export interface AbortControllerLike {
  readonly signal: AbortSignalLike;
  abort(): void;
}

interface Globals {
  fetch?: FetchLike;
  WebSocket?: WebSocketConstructor;
  AbortController?: new () => AbortControllerLike;
  crypto?: { randomUUID?: () => string; getRandomValues?: (a: Uint8Array) => Uint8Array };
  console?: { error(...args: unknown[]): void };
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(t: unknown): void;
}

export const g = globalThis as unknown as Globals;

/** The platform's WebSocket: the global one (browsers, React Native, Deno, Bun, Node 22+),
 * else the `ws` package's when it is installed (Node 20), else undefined. `ws` is loaded
 * by a dynamic import of a name held in a variable, so browser bundlers neither follow
 * nor bundle it, and a platform with a global WebSocket never loads it. */
export async function platformWebSocket(): Promise<WebSocketConstructor | undefined> {
  if (g.WebSocket) return g.WebSocket;
  const name = "ws";
  try {
    const mod = (await import(/* @vite-ignore */ /* webpackIgnore: true */ name)) as {
      WebSocket?: WebSocketConstructor;
      default?: WebSocketConstructor;
    };
    return mod.WebSocket ?? mod.default;
  } catch {
    return undefined;
  }
}

export const OPEN = 1;

/** A fresh client_msg_id: a UUID where the platform has one, else 32 hex digits. */
export function newId(): string {
  const c = g.crypto;
  if (c?.randomUUID) return c.randomUUID();
  const bytes = new Uint8Array(16);
  if (c?.getRandomValues) c.getRandomValues(bytes);
  else for (let i = 0; i < 16; i++) bytes[i] = Math.floor(Math.random() * 256);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

export const sleep = (ms: number): Promise<void> =>
  new Promise((resolve) => {
    g.setTimeout(resolve, ms);
  });
