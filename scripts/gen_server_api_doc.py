"""Write the reference part of ``docs/server-api.md`` from the server's OpenAPI document:
every route under ``/v1/server/`` and ``/v1/bots/``, with its scope, its typed body and
its answer, so the page cannot drift from the code.

The page's prose stays by hand; the generated part sits between the two marker lines.

    .venv/bin/python scripts/gen_server_api_doc.py          # write it
    .venv/bin/python scripts/gen_server_api_doc.py --check  # exit 1 if it is stale

``tests/unit/test_server_api_doc.py`` fails when the committed page is stale."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "server-api.md"
BEGIN = "<!-- BEGIN GENERATED: scripts/gen_server_api_doc.py -->"
END = "<!-- END GENERATED -->"
PREFIXES = ("/v1/server/", "/v1/bots/")


def _name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _type(s: dict[str, Any]) -> str:
    if "$ref" in s:
        return f"`{_name(s['$ref'])}`"
    if "const" in s:
        return f"`{json.dumps(s['const'])}`"
    if "enum" in s:
        return " \\| ".join(f'`"{v}"`' if isinstance(v, str) else f"`{v}`" for v in s["enum"])
    for key in ("anyOf", "oneOf"):
        if key in s:
            return " or ".join(_type(x) for x in s[key])
    t = s.get("type")
    if t == "array":
        return f"list of {_type(s.get('items', {}))}"
    if t == "null":
        return "null"
    if t == "object" and "properties" not in s:
        return "object"
    return str(t) if t else "**any**"  # an untyped field: the doc test refuses it


def _fields(schema: dict[str, Any], comps: dict[str, Any]) -> list[str]:
    if "$ref" in schema:
        schema = comps[_name(schema["$ref"])]
    props = schema.get("properties", {})
    if not props:
        return []
    required = set(schema.get("required", []))
    rows = ["| field | type | | |", "|---|---|---|---|"]
    for name, p in props.items():
        desc = (p.get("description") or "").replace("|", "\\|").replace("\n", " ")
        title = p.get("title", "")
        shown = p.get("alias", name) if title else name
        rows.append(
            f"| `{shown}` | {_type(p)} | {'required' if name in required else 'optional'} "
            f"| {desc} |"
        )
    return rows


def _models(ref: dict[str, Any], comps: dict[str, Any], seen: set[str]) -> list[str]:
    """The tables of a body or answer model and of the models it names, once each."""
    out: list[str] = []
    todo = [ref]
    while todo:
        s = todo.pop(0)
        if s.get("type") == "array":
            todo.append(s.get("items", {}))
            continue
        if "anyOf" in s:
            todo += s["anyOf"]
            continue
        if "$ref" not in s:
            continue
        name = _name(s["$ref"])
        if name in seen:
            continue
        seen.add(name)
        model = comps[name]
        out += [f"`{name}`" + (f": {model['description']}" if model.get("description") else "")]
        out += ["", *_fields(model, comps), ""]
        for p in model.get("properties", {}).values():
            for x in (p, p.get("items", {}), *p.get("anyOf", [])):
                if "$ref" in x or x.get("type") == "array":
                    todo.append(x)
    return out


def render_section(doc: dict[str, Any]) -> str:
    comps = doc["components"]["schemas"]
    lines: list[str] = []
    for path, ops in doc["paths"].items():
        if not path.startswith(PREFIXES):
            continue
        for method, op in ops.items():
            scope = op.get("x-scope")
            auth = f"`X-Api-Key`, scope `{scope}`" if scope else "`Authorization: Bearer` (a user)"
            lines += [f"### `{method.upper()} {path}`", "", op.get("summary", ""), ""]
            lines += [f"- Auth: {auth}"]
            if method in ("post", "put") and scope:
                lines += ["- Takes `Idempotency-Key`"]
            ok = next(
                (c for c in sorted(op.get("responses", {})) if c.startswith("2")), "200"
            )
            content = op["responses"].get(ok, {}).get("content", {})
            answer = content.get("application/json", {}).get("schema")
            lines += [f"- Answer: {ok}" + (f" {_type(answer)}" if answer else " (no body)")]
            body = (
                op.get("requestBody", {}).get("content", {}).get("application/json", {})
            ).get("schema")
            if body:
                lines += [f"- Body: {_type(body)}"]
            lines += [""]
            seen: set[str] = set()
            for s in (body, answer):
                if s:
                    lines += _models(s, comps, seen)
    return "\n".join([BEGIN, "", *lines, END])


def render() -> str:
    sys.path.insert(0, str(ROOT))
    from im_server.app import create_app

    text = DOC.read_text(encoding="utf-8")
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return head + render_section(create_app().openapi()) + tail


def main() -> int:
    out = render()
    if "--check" in sys.argv:
        if DOC.read_text(encoding="utf-8") != out:
            print(f"{DOC} is stale: run .venv/bin/python scripts/gen_server_api_doc.py")
            return 1
        return 0
    DOC.write_text(out, encoding="utf-8")
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
