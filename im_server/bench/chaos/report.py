"""The outcome of one scenario (:class:`Result`: invariant violations and figures) and
the table that sums up several."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

FINDINGS = (
    "lost",
    "duplicated",
    "seq_violations",
    "read_regressions",
    "resend_bad",
    "history_bad",
    "exited",
)
"""The lists of a :class:`Result` that name what went wrong (empty when all is well)."""


@dataclass
class Result:
    scenario: str
    killed: str = ""
    t_kill_s: float = 0.0  # seconds of load before the kill
    acked_at_kill: int = 0  # distinct messages ok-acked before the kill
    stream_at_kill: int | None = None  # XLEN just before the kill
    pending_at_kill: int | None = None  # entries read by the persister, not yet acked
    acked_total: int = 0
    sends: int = 0
    attempts: int = 0
    duplicate_acks: int = 0  # ok acks with duplicate: true (retries of queued sends)
    refused: int = 0
    unanswered: int = 0  # sends never answered ok by the end (given up)
    read_reports_confirmed: int = 0
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    seq_violations: list[str] = field(default_factory=list)
    read_regressions: list[str] = field(default_factory=list)
    resend_bad: list[str] = field(default_factory=list)
    history_bad: list[str] = field(default_factory=list)
    exited: list[str] = field(default_factory=list)  # processes the test did not kill, gone
    wiped: int = 0  # redis-empty: acked, still only in the stream when the data was deleted
    restart_s: float = 0.0  # kill -> component back (restart call returned)
    first_ack_s: float | None = None  # kill -> first ok ack received after the restart
    resume_s: float | None = (
        None  # kill -> every sender has an ok ack for a send made after the kill
    )
    max_ack_gap_s: float = 0.0  # longest stretch without any ok ack around the kill
    backlog_persisted_s: float | None = None  # kill -> all pre-kill acks in PostgreSQL
    drain_s: float | None = None  # load stop -> stream empty, every ack in PostgreSQL
    recovered: bool = False
    settled: bool = False
    errors: dict[str, int] = field(default_factory=dict)
    stream_diag: str = ""  # when the stream did not drain: what Redis says about it
    logs: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return (
            self.recovered
            and self.settled
            and not (
                self.lost
                or self.duplicated
                or self.seq_violations
                or self.read_regressions
                or self.resend_bad
                or self.history_bad
                or self.exited
            )
        )

    def summary(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("logs")
        for k in FINDINGS:
            d[f"{k}_n"] = len(d[k])
            d[k] = d[k][:20]
        d["ok"] = self.ok
        return d

    def report(self, with_logs: bool = True) -> str:
        lines = [
            f"scenario {self.scenario}: killed {self.killed} after {self.t_kill_s:.2f} s of load "
            f"({self.acked_at_kill} acked; stream {self.stream_at_kill}, pending {self.pending_at_kill})",
            f"  acked {self.acked_total} of {self.sends} sends ({self.attempts} attempts, "
            f"{self.duplicate_acks} duplicate acks, {self.refused} refused, {self.unanswered} unanswered); "
            f"{self.read_reports_confirmed} read cursors confirmed; "
            f"errors {self.errors}",
            f"  restart {self.restart_s:.2f} s, first ack {self.first_ack_s}, resume {self.resume_s}, max gap "
            f"{self.max_ack_gap_s:.2f} s, backlog persisted {self.backlog_persisted_s}, drain {self.drain_s}",
            f"  recovered={self.recovered} settled={self.settled} wiped={self.wiped}",
        ]
        for k in FINDINGS:
            v = getattr(self, k)
            if v:
                lines.append(f"  {k} ({len(v)}): " + "; ".join(v[:15]))
        if self.stream_diag:
            lines.append(
                "  stream when the settle wait gave up:\n    "
                + self.stream_diag.replace("\n", "\n    ")
            )
        if with_logs and not self.ok:
            for name, text in self.logs.items():
                lines.append(f"--- {name} ---\n{text}")
        return "\n".join(lines)


def _fmt(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)


def print_table(results: list[Result]) -> None:
    cols: list[tuple[str, Callable[[Result], object]]] = [
        ("scenario", lambda r: r.scenario),
        ("acked@kill", lambda r: r.acked_at_kill),
        ("stream@kill", lambda r: r.stream_at_kill),
        ("acked", lambda r: r.acked_total),
        ("lost", lambda r: len(r.lost)),
        ("dup", lambda r: len(r.duplicated)),
        ("seq!", lambda r: len(r.seq_violations)),
        ("read!", lambda r: len(r.read_regressions)),
        ("wiped", lambda r: r.wiped),
        ("restart s", lambda r: r.restart_s),
        ("1st ack s", lambda r: r.first_ack_s),
        ("resume s", lambda r: r.resume_s),
        ("max gap s", lambda r: r.max_ack_gap_s),
        ("backlog s", lambda r: r.backlog_persisted_s),
        ("drain s", lambda r: r.drain_s),
        ("ok", lambda r: "yes" if r.ok else "NO"),
    ]
    table = [[_fmt(f(r)) for _, f in cols] for r in results]
    widths = [max(len(h), *(len(row[k]) for row in table)) for k, (h, _) in enumerate(cols)]
    print("  ".join(h.rjust(w) for (h, _), w in zip(cols, widths, strict=True)))
    for row in table:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
