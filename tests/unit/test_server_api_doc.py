"""``docs/server-api.md``'s reference is generated from the OpenAPI document: the
committed page must be what the generator writes now."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_committed_server_api_reference_is_current() -> None:
    spec = importlib.util.spec_from_file_location(
        "gen_server_api_doc", ROOT / "scripts" / "gen_server_api_doc.py"
    )
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    committed = (ROOT / "docs" / "server-api.md").read_text(encoding="utf-8")
    assert gen.BEGIN in committed and gen.END in committed
    assert committed == gen.render(), (
        "docs/server-api.md is stale: run .venv/bin/python scripts/gen_server_api_doc.py"
    )
    assert "**any**" not in committed.split(gen.BEGIN)[1], "an untyped field in the server API"
