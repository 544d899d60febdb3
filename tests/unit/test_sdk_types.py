"""The TypeScript client's wire types (sdk/typescript/src/wire.ts) are generated from the
server's frame schema and OpenAPI document: the committed file must be what the
generator writes now, so a change of a model without a regeneration fails here."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_sdk_types", ROOT / "scripts" / "gen_sdk_types.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_committed_wire_types_match_the_server_models() -> None:
    gen = _generator()
    committed = (ROOT / "sdk" / "typescript" / "src" / "wire.ts").read_text(encoding="utf-8")
    assert committed == gen.render(), (
        "sdk/typescript/src/wire.ts is stale: run .venv/bin/python scripts/gen_sdk_types.py"
    )


def test_every_server_frame_type_is_in_the_union() -> None:
    text = _generator().render()
    for name in ("MessagePush", "ReadPush", "DeliveredPush", "TypingPush", "PresencePush"):
        assert f"export interface {name} " in text
        assert name in text.split("export type ServerFrame =")[1].split(";")[0]
