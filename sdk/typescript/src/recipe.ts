// The two network steps of the catch-up recipe (docs/sync.md), shared by ImClient and
// clients that keep their own message state (the web client): sync pages from a version
// while has_more, and a seq range pulled as ascending history pages.

import type { AbortSignalLike } from "./env.js";
import type { Http } from "./http.js";
import type { HistoryPage, SyncPage } from "./wire.js";

/** Waits before asking again for seqs handed out but not persisted yet (a push outran
 * the writer). */
export const GAP_RETRY_MS = [50, 100, 200, 400, 800, 1600];

export interface SyncPagesOptions {
  /** Seconds the first page may wait for news (a long poll). Default 0. */
  wait?: number;
  recent?: number;
  limit?: number;
  /** Aborts the page in flight (an AbortError). */
  signal?: AbortSignalLike;
  maxPages?: number;
  /** The long poll (the first page, with wait > 0) starts (true) and ends (false). */
  onLongPoll?: (polling: boolean) => void;
}

/** GET /v1/sync from `version()` while has_more; `apply` takes each page and moves the
 * version `version()` reads. */
export async function syncPages(
  api: Pick<Http, "sync">,
  version: () => number,
  apply: (page: SyncPage) => void,
  o: SyncPagesOptions = {},
): Promise<void> {
  for (let page = 0; page < (o.maxPages ?? Number.POSITIVE_INFINITY); page++) {
    const since = version();
    const wait = page === 0 ? (o.wait ?? 0) : 0;
    if (wait > 0) o.onLongPoll?.(true);
    let ans: SyncPage;
    try {
      ans = await api.sync({ since, wait, recent: o.recent, limit: o.limit }, o.signal);
    } finally {
      if (wait > 0) o.onLongPoll?.(false);
    }
    apply(ans);
    if (!ans.has_more || version() === since) break;
  }
}

/** Fetch seqs [begin, end] as ascending history pages of `pageSize` seqs (at most 200).
 * `onPage(page, from, covered)`: the seqs [from, covered] are settled (held now, or not
 * there for me); the ones above `page.max_seq` are handed out but not persisted yet.
 * Resolves with the first seq not available yet, or null when all of them were. */
export async function pullPages(
  api: Pick<Http, "history">,
  convId: string,
  begin: number,
  end: number,
  onPage: (page: HistoryPage, from: number, covered: number) => void,
  pageSize = 200,
): Promise<number | null> {
  const size = Math.max(1, Math.min(200, pageSize));
  let cur = begin;
  while (cur <= end) {
    const hi = Math.min(end, cur + size - 1);
    const ans = await api.history(convId, { begin: cur, end: hi, limit: size, order: "asc" });
    const covered = Math.min(hi, ans.max_seq);
    onPage(ans, cur, covered);
    if (covered < hi) return covered + 1;
    cur = hi + 1;
  }
  return null;
}
