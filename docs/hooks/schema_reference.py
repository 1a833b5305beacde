"""MkDocs hook: renders the JSON schemas under state/ into reference pages at build time.

A page holds a line `<!-- schema: NAME.schema.json -->`; the build replaces it with tables of
every key the schema knows (type, default, allowed values, limits, what localdet does with a
key it accepts and ignores). The schema is the one source of the defaults (localdet fills
them from it), so the page cannot drift from what localdet does.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

MARKER = re.compile(r"^<!-- schema: (?P<name>[\w.-]+\.schema\.json) -->$", re.M)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    state = Path(config["config_file_path"]).parent / "state"
    return MARKER.sub(lambda m: render(json.loads((state / m["name"]).read_text())), markdown)


def render(schema: dict[str, Any]) -> str:
    """The schema as Markdown: its top level, then one section per definition it uses."""
    defs: dict[str, Any] = schema.get("$defs", {})
    sections: list[str] = []
    used: list[str] = []

    def ref_name(node: Any) -> str | None:
        if isinstance(node, dict) and "$ref" in node:
            return str(node["$ref"]).rsplit("/", 1)[-1]
        return None

    def table(node: dict[str, Any], path: str) -> str:
        rows = ["| key | type | default | notes |", "| --- | --- | --- | --- |"]
        nested: list[tuple[str, dict[str, Any]]] = []
        required = set(node.get("required", []))
        for key, prop in node.get("properties", {}).items():
            if prop is True:  # the discriminator of an if/then, described by its parent
                continue
            name = f"{path}.{key}" if path else key
            rows.append(row(name, prop, key in required))
            if isinstance(prop, dict) and "properties" in prop and "$ref" not in prop:
                nested.append((name, prop))
        text = "\n".join(rows)
        for name, prop in nested:
            text += f"\n\n### `{name}`\n\n" + table(prop, name)
        return text

    def row(name: str, prop: Any, required: bool) -> str:
        if not isinstance(prop, dict):
            return f"| `{name}` | any | | |"
        notes: list[str] = []
        if "x-ignored" in prop:
            notes.append("accepted, and noted in the warnings: " + str(prop["x-ignored"]))
        kind = type_of(prop)
        target = ref_name(prop)
        if target is not None:
            link(target)
            kind = f"[{target}](#def-{target})"
        elif isinstance(prop.get("additionalProperties"), dict):
            inner = ref_name(prop["additionalProperties"])
            if inner is not None:
                link(inner)
                kind = f"mapping of names to [{inner}](#def-{inner})"
        if required:
            notes.insert(0, "required")
        if "x-supported" in prop:
            notes.append("localdet runs: " + ", ".join(f"`{v}`" for v in prop["x-supported"]))
        notes += limits(prop)
        for text in (prop.get("description"), prop.get("$comment")):
            if text:
                notes.append(str(text))
        default = f"`{json.dumps(prop['default'])}`" if "default" in prop else ""
        return f"| `{name}` | {kind} | {default} | {cell('; '.join(notes))} |"

    def link(name: str) -> None:
        if name not in used:
            used.append(name)

    sections.append(table(schema, ""))
    # Definitions are rendered as they are found, so the ones they use follow them; then
    # those no key reaches (a batch job's config, `job`).
    done = 0
    for name in [*defs, None]:
        while done < len(used):
            sections.append(definition(used[done], defs[used[done]], link, table))
            done += 1
        if name is not None:
            link(name)
    return "\n\n".join(sections)


def definition(name: str, node: dict[str, Any], link: Any, table: Any) -> str:
    # A definition's own $comment is written for localdet's developers; its keys' are not.
    text = f"## `{name}` {{#def-{name}}}\n\n"
    kind = type_of(node)
    facts = [f"type: {kind}"] if kind else []
    facts += limits(node)
    if facts:
        text += "; ".join(facts) + "\n\n"
    for part in node.get("allOf", []):
        for key in ("$ref",):
            if key in part:
                target = part[key].rsplit("/", 1)[-1]
                link(target)
                text += f"As [{target}](#def-{target}), and:\n\n"
        then = part.get("then", {})
        if "$ref" in then:
            target = then["$ref"].rsplit("/", 1)[-1]
            link(target)
            const = part.get("if", {}).get("properties", {}).get("type", {}).get("const")
            text += f"- `type: {const}`: [{target}](#def-{target})\n"
    if isinstance(node.get("then"), dict):  # a mapping with a type is one, else a group
        text += ("A mapping with `type` is one hyperparameter "
                 "([hp_leaf](#def-hp_leaf)); a mapping without it is a group of "
                 "hyperparameters; any other value is a constant.\n")
        link("hp_leaf")
    if "items" in node and isinstance(node["items"], dict) and "$ref" in node["items"]:
        target = node["items"]["$ref"].rsplit("/", 1)[-1]
        link(target)
        text += f"Items: [{target}](#def-{target})\n"
    if "properties" in node:
        text += "\n" + table(node, "")
    for searcher, defaults in node.get("x-defaults-by-name", {}).items():
        filled = ", ".join(f"`{key}: {json.dumps(value)}`" for key, value in defaults.items())
        text += f"\n\nDefaults of `{searcher}`: {filled}."
    return text.rstrip() + "\n"


def type_of(node: dict[str, Any]) -> str:
    if "enum" in node:
        return "one of " + ", ".join(f"`{json.dumps(v)}`" for v in node["enum"])
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    kind = node.get("type")
    if isinstance(kind, list):
        return " or ".join(kind)
    return str(kind) if kind else ""


def limits(node: dict[str, Any]) -> list[str]:
    words = {"minimum": "at least", "maximum": "at most", "exclusiveMinimum": "above",
             "minItems": "items at least", "minLength": "length at least",
             "minProperties": "keys at least", "maxProperties": "keys at most"}
    out = [f"{word} {node[key]}" for key, word in words.items() if key in node]
    if "pattern" in node and not node.get("x-messages", {}).get("pattern"):
        out.append(f"matches `{node['pattern']}`")
    for message in node.get("x-messages", {}).values():
        if message not in out:
            out.append(str(message))
    return out


def cell(text: str) -> str:
    """Text that stays inside one table cell."""
    return text.replace("|", "\\|").replace("\n", " ")
