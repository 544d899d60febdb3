// Catch-up arithmetic without I/O: a port of im_server/client/sync.py (SyncState).
// apply(answer) -> seq ranges to pull; add(msgs) -> only messages not held yet (dedupe
// by (conv_id, seq)); onPush(msg) -> the gap to pull; markPulled/release close a pull.
// Ranges handed out stay "requested" until pulled or released, so a push racing a pull
// or two sync pages naming one conversation never pull the same seqs twice. A pulled
// range is "resolved": seqs it did not return do not exist for this user.
function merge(intervals) {
    const sorted = intervals.map((i) => [i[0], i[1]]).sort((a, b) => a[0] - b[0] || a[1] - b[1]);
    const out = [];
    for (const [b, e] of sorted) {
        const last = out[out.length - 1];
        if (last && b <= last[1] + 1) {
            if (e > last[1])
                last[1] = e;
        }
        else
            out.push([b, e]);
    }
    return out;
}
function subtract(intervals, begin, end) {
    const out = [];
    for (const [b, e] of intervals) {
        if (e < begin || b > end) {
            out.push([b, e]);
            continue;
        }
        if (b < begin)
            out.push([b, begin - 1]);
        if (e > end)
            out.push([end + 1, e]);
    }
    return out;
}
function complement(lo, hi, blocked) {
    const out = [];
    let cur = lo;
    for (const [b, e] of merge(blocked)) {
        if (e < cur)
            continue;
        if (b > hi)
            break;
        if (b > cur)
            out.push([cur, b - 1]);
        cur = e + 1;
        if (cur > hi)
            break;
    }
    if (cur <= hi)
        out.push([cur, hi]);
    return out;
}
/** Sorted seqs as inclusive intervals (for storage). */
export function toIntervals(seqs) {
    return merge(Array.from(seqs, (s) => [s, s]));
}
/** What one device knows about one conversation's seqs. */
export class ConvCursor {
    minSeq = 1;
    maxSeq = 0;
    /** Every seq in [minSeq, contiguous] is held or known not to exist. */
    contiguous = 0;
    /** Held seqs above `contiguous`. */
    ahead = new Set();
    /** How many seqs are held (at or below contiguous they are not listed one by one). */
    resolved = [];
    requested = [];
    windowKnown = false;
    /** Held seqs at or below `contiguous`, as intervals (compact). */
    below = [];
    holds(seq) {
        if (seq > this.contiguous)
            return this.ahead.has(seq);
        for (const [b, e] of this.below)
            if (b <= seq && seq <= e)
                return true;
        return false;
    }
    pushBelow(seq) {
        const last = this.below[this.below.length - 1];
        if (last && last[1] + 1 === seq)
            last[1] = seq;
        else if (!last || last[1] < seq)
            this.below.push([seq, seq]);
        else
            this.below = merge([...this.below, [seq, seq]]);
    }
    hold(seq) {
        if (seq < this.minSeq || this.holds(seq))
            return false;
        if (seq === this.contiguous + 1) {
            this.contiguous = seq;
            this.pushBelow(seq);
            if (this.ahead.size || this.resolved.length)
                this.advance();
        }
        else if (seq > this.contiguous)
            this.ahead.add(seq);
        else
            this.pushBelow(seq); // below contiguous inside a resolved range: cannot happen often
        return true;
    }
    advance() {
        for (;;) {
            const nxt = this.contiguous + 1;
            if (this.ahead.has(nxt)) {
                this.ahead.delete(nxt);
                this.contiguous = nxt;
                this.pushBelow(nxt);
                continue;
            }
            const r = this.resolved.find(([b, e]) => b <= nxt && nxt <= e);
            if (r) {
                this.contiguous = r[1];
                continue;
            }
            break;
        }
        this.resolved = this.resolved.filter(([, e]) => e > this.contiguous);
    }
    missing(lo, hi, alsoHeld = []) {
        lo = Math.max(lo, this.contiguous + 1, this.minSeq);
        if (lo > hi)
            return [];
        const blocked = [];
        for (const s of this.ahead)
            if (lo <= s && s <= hi)
                blocked.push([s, s]);
        for (const s of alsoHeld)
            if (lo <= s && s <= hi)
                blocked.push([s, s]);
        blocked.push(...this.resolved, ...this.requested);
        return complement(lo, hi, blocked);
    }
    setWindow(minSeq, maxSeq) {
        if (minSeq !== undefined && minSeq !== null) {
            const m = Math.max(1, minSeq);
            if (m > this.minSeq || !this.windowKnown)
                this.raiseMin(m);
            else if (m < this.minSeq) {
                // never expected; reopen what lies below the old bound
                this.minSeq = m;
                const held = [...this.heldSeqs()];
                this.contiguous = m - 1;
                this.resolved = [];
                this.below = [];
                this.ahead = new Set(held);
                this.advance();
            }
            this.windowKnown = true;
        }
        if (maxSeq !== undefined && maxSeq !== null)
            this.maxSeq = maxSeq;
    }
    *heldSeqs() {
        for (const [b, e] of this.below)
            for (let s = b; s <= e; s++)
                yield s;
        yield* [...this.ahead].sort((a, b) => a - b);
    }
    raiseMin(minSeq) {
        if (minSeq > this.minSeq) {
            this.below = subtract(this.below, 0, minSeq - 1);
            for (const s of [...this.ahead])
                if (s < minSeq)
                    this.ahead.delete(s);
            this.requested = subtract(this.requested, 0, minSeq - 1);
        }
        this.minSeq = Math.max(this.minSeq, minSeq);
        if (this.contiguous < this.minSeq - 1)
            this.contiguous = this.minSeq - 1;
        this.advance();
    }
}
export class SyncState {
    version = 0;
    hasMore = false;
    convs = new Map();
    cursor(convId) {
        let c = this.convs.get(convId);
        if (!c) {
            c = new ConvCursor();
            this.convs.set(convId, c);
        }
        return c;
    }
    held(convId, seq) {
        return this.convs.get(convId)?.holds(seq) ?? false;
    }
    minSeq(convId) {
        return this.convs.get(convId)?.minSeq ?? 1;
    }
    contiguous(convId) {
        return this.convs.get(convId)?.contiguous ?? 0;
    }
    /** Take one /v1/sync answer; return the ranges to pull (marked requested). */
    apply(resp) {
        const ranges = [];
        for (const st of resp.conversations ?? []) {
            const cur = this.cursor(st.conv_id);
            cur.setWindow(st.min_seq, st.max_seq);
            const embedded = (st.messages ?? []).map((m) => m.seq);
            for (const [b, e] of cur.missing(cur.minSeq, cur.maxSeq, embedded)) {
                cur.requested = merge([...cur.requested, [b, e]]);
                ranges.push([st.conv_id, b, e]);
            }
        }
        if (typeof resp.version === "number")
            this.version = Math.max(this.version, resp.version);
        this.hasMore = Boolean(resp.has_more);
        return ranges;
    }
    /** Correct the window from a history answer: min only rises, max only grows. */
    observeWindow(convId, minSeq, maxSeq) {
        const cur = this.cursor(convId);
        if (minSeq !== undefined && minSeq !== null && (minSeq > cur.minSeq || !cur.windowKnown)) {
            cur.raiseMin(Math.max(1, minSeq));
            cur.windowKnown = true;
        }
        if (maxSeq !== undefined && maxSeq !== null && maxSeq > cur.maxSeq)
            cur.maxSeq = maxSeq;
    }
    /** Record messages; return only those not held before (and not below the window). */
    add(msgs) {
        const out = [];
        for (const m of msgs)
            if (this.cursor(m.conv_id).hold(m.seq))
                out.push(m);
        return out;
    }
    /** The gap to pull when a pushed message skips seqs (marked requested), else null. */
    onPush(m) {
        if (m.seq <= this.contiguous(m.conv_id) + 1)
            return null;
        return this.claim(m.conv_id, 1, m.seq - 1);
    }
    /** One range spanning the seqs of [begin, end] neither held, resolved nor requested. */
    claim(convId, begin, end) {
        const cur = this.cursor(convId);
        const holes = cur.missing(begin, end);
        if (!holes.length)
            return null;
        cur.requested = merge([...cur.requested, ...holes]);
        return [convId, holes[0][0], holes[holes.length - 1][1]];
    }
    markPulled(convId, begin, end) {
        if (begin > end)
            return;
        const cur = this.cursor(convId);
        cur.requested = subtract(cur.requested, begin, end);
        const lo = Math.max(begin, cur.contiguous + 1);
        if (lo <= end) {
            cur.resolved = merge([...cur.resolved, [lo, end]]);
            cur.advance();
        }
    }
    release(convId, begin, end) {
        if (begin > end)
            return;
        const cur = this.cursor(convId);
        cur.requested = subtract(cur.requested, begin, end);
    }
    /** Ranges up to the known max_seq neither held nor requested (marked requested). */
    missing(convId) {
        const cur = this.cursor(convId);
        const holes = cur.missing(cur.minSeq, cur.maxSeq);
        if (holes.length)
            cur.requested = merge([...cur.requested, ...holes]);
        return holes.map(([b, e]) => [convId, b, e]);
    }
    snapshot() {
        const convs = {};
        for (const [id, c] of this.convs) {
            convs[id] = {
                min: c.minSeq,
                max: c.maxSeq,
                contiguous: c.contiguous,
                held: merge([...c.below, ...toIntervals(c.ahead)]),
                known: c.windowKnown,
            };
        }
        return { version: this.version, convs };
    }
    static restore(snap) {
        const s = new SyncState();
        s.version = snap.version;
        for (const [id, c] of Object.entries(snap.convs)) {
            const cur = s.cursor(id);
            cur.minSeq = c.min;
            cur.maxSeq = c.max;
            cur.windowKnown = c.known;
            cur.contiguous = c.contiguous;
            for (const [b, e] of c.held) {
                if (e <= c.contiguous)
                    cur.below.push([b, e]);
                else {
                    if (b <= c.contiguous)
                        cur.below.push([b, c.contiguous]);
                    for (let q = Math.max(b, c.contiguous + 1); q <= e; q++)
                        cur.ahead.add(q);
                }
            }
        }
        return s;
    }
}
