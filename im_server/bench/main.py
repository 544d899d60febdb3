"""``im-server bench [name] [options]``: the one entry of every benchmark. Without a name
(or with ``load``) the send-path load benchmark with its bare-echo baseline; with a
name, that benchmark (``--help`` after it lists its options). Each starts its own stores
and server in a temp folder and reports the same way: a table, or one JSON object with
``--json`` (``common.report``). ``./scripts/bench <name>`` is the same command."""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = {
    "load": "im_server.bench.runner",
    "app_tokens": "im_server.bench.app_tokens",
    "before_send": "im_server.bench.before_send",
    "catch_up": "im_server.bench.catch_up",
    "chaos": "im_server.bench.chaos.main",
    "member_adds": "im_server.bench.member_adds",
    "presence": "im_server.bench.presence",
    "push": "im_server.bench.push",
    "read_storm": "im_server.bench.read_storm",
    "search": "im_server.bench.search",
    "synapse": "im_server.bench.synapse",
    "unread_query": "im_server.bench.unread_query",
    "uploads": "im_server.bench.uploads",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["list"], ["--list"]):
        print("benchmarks: " + " ".join(BENCHMARKS))
        return 0
    name = argv[0] if argv and argv[0] in BENCHMARKS else "load"
    rest = argv[1:] if argv and argv[0] in BENCHMARKS else argv
    module = importlib.import_module(BENCHMARKS[name])
    return int(module.main(rest) or 0)
