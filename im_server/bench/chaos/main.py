"""Run the chaos scenarios of :mod:`im_server.bench.chaos` and print what they found:

    ./scripts/bench chaos [--scenarios gateway,redis,cluster,webhooks] [--pre 15] [--post 5]
                          [--window 16] [--json] [--keep]

Every scenario by default, one after the other, each with its own stores in a temp folder;
``cluster`` is the scenario of a Valkey Cluster's failures (``chaos/cluster.py``),
``webhooks`` the kill -9 of a process delivering webhooks (``chaos/webhooks.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import orjson

from im_server.bench import chaos
from im_server.bench.chaos import cluster as chaos_cluster
from im_server.bench.chaos import webhooks as chaos_webhooks


async def amain(args: argparse.Namespace) -> int:
    p = chaos.Params(
        pre_s=args.pre,
        post_s=args.post,
        down_s=args.down,
        window=args.window,
        rate=args.rate,
        settle_timeout=args.settle_timeout,
    )
    names = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    results: list[chaos.Result] = []
    cluster_res: dict[str, object] | None = None
    webhooks_res: dict[str, object] | None = None
    base = Path(tempfile.mkdtemp(prefix="im-chaos-"))
    try:
        if "cluster" in names:
            names.remove("cluster")
            if not args.json:
                print("== cluster: kill -9 of a primary (never restarted), then a slot move")
            cluster_res = await chaos_cluster.run(base / "cluster", load_s=args.pre)
            if not args.json:
                chaos_cluster.print_table(cluster_res)
        if "webhooks" in names:
            names.remove("webhooks")
            if not args.json:
                print("== webhooks: kill -9 of a delivering process, restarted", flush=True)
            webhooks_res = await chaos_webhooks.run(
                base / "webhooks", pre_s=args.pre, post_s=args.post
            )
            if not args.json:
                chaos_webhooks.print_table(webhooks_res)
        for name in names:
            if not args.json:
                print(
                    f"== {name}: {p.pre_s:.0f} s of load, kill -9, restart, {p.post_s:.0f} s more",
                    flush=True,
                )
            r = await chaos.run_scenario(name, base / name, p)
            results.append(r)
            if not args.json:
                print(r.report(with_logs=not r.ok), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    if args.json:
        print(
            orjson.dumps(
                {
                    "params": asdict(p),
                    "scenarios": [r.summary() for r in results],
                    "cluster": cluster_res,
                    "webhooks": webhooks_res,
                }
            ).decode()
        )
    elif results:
        print()
        chaos.print_table(results)
        print(
            "\nacked@kill: distinct messages ok-acked before the kill; lost/dup/seq!/read!: "
            "invariant violations (must be 0); wiped: redis-empty, acked messages still only "
            "in the deleted stream; restart: kill -> component back; 1st ack: kill -> first "
            "ok ack after the restart; resume: kill -> every sender has an ok ack for a send made "
            "after the kill; max gap: longest stretch without any ok ack; backlog: "
            "kill -> every pre-kill ack in PostgreSQL; drain: load stop -> stream empty."
        )
    cluster_ok = cluster_res is None or not any(
        cluster_res[k] for k in ("lost", "duplicated", "seq_violations")
    )
    webhooks_ok = webhooks_res is None or not any(
        webhooks_res[k] for k in ("missing", "order_violations")
    )
    return 0 if all(r.ok for r in results) and cluster_ok and webhooks_ok else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="./scripts/bench chaos",
        description=f"{__doc__}\n{chaos.__doc__}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--scenarios", default=",".join((*chaos.SCENARIOS, "cluster", "webhooks")))
    ap.add_argument("--pre", type=float, default=15.0, help="seconds of load before the kill")
    ap.add_argument("--post", type=float, default=5.0, help="seconds of load after recovery")
    ap.add_argument("--down", type=float, default=1.0, help="seconds a store stays dead")
    ap.add_argument("--window", type=int, default=16, help="sends in flight per sender")
    ap.add_argument("--rate", type=float, default=0.0, help="new sends/s per sender (0: no cap)")
    ap.add_argument("--settle-timeout", type=float, default=120.0)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--keep", action="store_true", help="keep the temp folder (logs, data)")
    args = ap.parse_args(argv)
    try:
        import uvloop

        rc = uvloop.run(amain(args))
    except ImportError:
        rc = asyncio.run(amain(args))
    return rc


if __name__ == "__main__":
    sys.exit(main())
