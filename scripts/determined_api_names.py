#!/usr/bin/env python3
"""Regenerate the list of names Determined's modules exported, release by release.

    scripts/determined_api_names.py /path/to/determined            # writes the data file
    scripts/determined_api_names.py /path/to/determined --check    # exits 1 if it differs
    scripts/determined_api_names.py /path/to/determined --doc      # also fills the doc

For every final release tag from 0.17.0 to 0.38.x (no rc, ee or dryrun tags) it reads, with
`git show TAG:PATH`, the files that define the public modules (`determined`,
`determined.core`, `determined.keras`, `determined.keras.callbacks`,
`determined.experimental`, `determined.experimental.client`, `determined.common.experimental`,
`determined.searcher`)
and parses them with `ast`; no code of Determined's is run or
copied. A module's names are:

- in a package's `__init__.py`: the names its imports bind, its assignments, functions and
  classes, and its `__all__`, underscore names included;
- in a plain module file (`keras/callbacks.py`): its functions, classes, assignments and
  `__all__` (its imports are its own dependencies, not what it offers), except in the SDK's
  `experimental/client.py`, which offers the classes it imports;
- never names bound by importing something from outside `determined` (`import warnings`,
  `from importlib import metadata`): those are not Determined's API.

Statements inside `try`/`if`/`with` blocks at module level count (`__version__` is set in a
`try`). The result, {module: {name: releases}}, goes to docs/determined-api-names.json,
which docs/determined-api.md's "releases" column and tests/test_determined_api.py read.
`--doc` rewrites that column in the page's module tables and appends a row with status
`unclassified` for each name the page lacks (the test rejects it until a person decides).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple, Union

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "docs" / "determined-api-names.json"
DOC = REPO / "docs" / "determined-api.md"

# module -> the files that may define it, in the order they are tried
MODULE_FILES = {
    "determined": ["harness/determined/__init__.py"],
    "determined.core": ["harness/determined/core/__init__.py"],
    "determined.keras": ["harness/determined/keras/__init__.py"],
    "determined.keras.callbacks": ["harness/determined/keras/callbacks/__init__.py",
                                   "harness/determined/keras/callbacks.py"],
    "determined.experimental": ["harness/determined/experimental/__init__.py",
                                "harness/determined/experimental.py"],
    "determined.experimental.client": ["harness/determined/experimental/client.py"],
    "determined.common.experimental": ["harness/determined/common/experimental/__init__.py"],
    "determined.searcher": ["harness/determined/searcher/__init__.py"],
}
# Plain module files whose imports from `determined` are part of what they offer (the SDK's
# `client` hands out the classes it imports: `client.Checkpoint`, `client.OrderBy`).
REEXPORTING_FILES = {"harness/determined/experimental/client.py"}
# the objects user code touches: section -> (class, the files that may define it)
CLASSES = {
    "determined.keras.TFKerasTrial": "TFKerasTrial",
    "determined.keras.TFKerasTrialContext": "TFKerasTrialContext",
    "determined.keras.TFKerasExperimentalContext": "TFKerasExperimentalContext",
    "context.env": "EnvContext",
    "context.distributed": "DistributedContext",
    "determined.ClusterInfo": "ClusterInfo",
    "determined.TrialInfo": "TrialInfo",
}
# class -> the files that may define it; a base class found here adds its members
CLASS_FILES = {
    "TFKerasTrial": ["harness/determined/keras/_tf_keras_trial.py"],
    "Trial": ["harness/determined/_trial.py"],
    "LegacyTrial": ["harness/determined/_trial.py"],
    "TFKerasTrialContext": ["harness/determined/keras/_tf_keras_context.py"],
    "TFKerasContext": ["harness/determined/keras/_tf_keras_context.py"],
    "TFKerasExperimentalContext": ["harness/determined/keras/_tf_keras_context.py"],
    "DataLayerContext": ["harness/determined/_data_layer/_context.py"],
    "TrialContext": ["harness/determined/_trial_context.py",
                     "harness/determined/_train_context.py"],
    "_TrainContext": ["harness/determined/_train_context.py"],
    "EnvContext": ["harness/determined/_env_context.py"],
    "DistributedContext": ["harness/determined/core/_distributed.py",
                           "harness/determined/_core/_distributed.py",
                           "harness/determined/_train_context.py"],
    "ClusterInfo": ["harness/determined/_info.py"],
    "TrialInfo": ["harness/determined/_info.py"],
}
# private members Determined's own examples read (`info.trial._config`): user code touches them
TOUCHED_PRIVATE = {"TrialInfo": {"_config", "_steps_completed", "_trial_run_id", "_debug"}}
FIRST, LAST = (0, 17), (0, 38)
TAG = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)$")  # final releases only: no -rc, -ee, +dryrun


Version = Tuple[int, int, int]


def release_tags(checkout: Path) -> List[Tuple[Version, str]]:
    tags = subprocess.run(["git", "-C", str(checkout), "tag"], capture_output=True,
                          text=True, check=True).stdout.split()
    found: Dict[Version, str] = {}
    for tag in tags:
        match = TAG.match(tag)
        if match:
            version = tuple(int(p) for p in match.groups())
            if FIRST <= version[:2] <= LAST:
                found.setdefault(version, tag)  # type: ignore[arg-type]
    return sorted(found.items())


class Reader:
    """The files this script reads, at every release tag, read with two `git cat-file` runs
    (one request per file and tag would wait on the scheduler for every round trip): the
    first names the blob each tag's path holds, the second reads each distinct blob once."""

    def __init__(self, checkout: Path, tags: List[str]) -> None:
        paths = sorted({p for ps in [*MODULE_FILES.values(), *CLASS_FILES.values()]
                        for p in ps})
        requests = [f"{tag}:{path}" for tag in tags for path in paths]
        names = self._git(checkout, "--batch-check", requests).decode().splitlines()
        self.blob_of: Dict[str, str] = {}
        for request, header in zip(requests, names, strict=True):
            parts = header.split()
            if len(parts) == 3 and parts[1] == "blob":  # else "<request> missing"
                self.blob_of[request] = parts[0]
        shas = sorted(set(self.blob_of.values()))
        out = self._git(checkout, "--batch", shas)
        self.texts: Dict[str, str] = {}
        at = 0
        for sha in shas:  # each: "<sha> blob <size>\n<content>\n"
            end = out.index(b"\n", at)
            size = int(out[at:end].split()[2])
            self.texts[sha] = out[end + 1:end + 1 + size].decode()
            at = end + 1 + size + 1
        self.trees: Dict[str, ast.Module] = {}

    @staticmethod
    def _git(checkout: Path, mode: str, lines: List[str]) -> bytes:
        return subprocess.run(["git", "-C", str(checkout), "cat-file", mode],
                              input="".join(f"{line}\n" for line in lines).encode(),
                              capture_output=True, check=True).stdout

    def tree(self, tag: str, path: str) -> Optional[ast.Module]:
        """The file parsed, parsed once per distinct blob."""
        sha = self.blob_of.get(f"{tag}:{path}")
        if sha is None:
            return None
        if sha not in self.trees:
            self.trees[sha] = ast.parse(self.texts[sha])
        return self.trees[sha]


_readers: Dict[Path, Reader] = {}


def reader(checkout: Path) -> Reader:
    if checkout not in _readers:
        _readers[checkout] = Reader(checkout, [t for _, t in release_tags(checkout)])
    return _readers[checkout]


def _is_determined(module: Optional[str], level: int) -> bool:
    return level > 0 or module == "determined" or (module or "").startswith("determined.")


def _targets(target: ast.expr) -> Iterable[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from _targets(element)


def _all_list(value: ast.expr) -> List[str]:
    if isinstance(value, (ast.List, ast.Tuple)):
        return [e.value for e in value.elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def exported_names(tree: ast.Module, package_init: bool) -> Set[str]:
    """The names a module file binds at module level, by the rules in the docstring."""
    names: Set[str] = set()

    def visit(body: List[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.ImportFrom) and package_init:
                if _is_determined(node.module, node.level):
                    names.update(a.asname or a.name for a in node.names if a.name != "*")
            elif isinstance(node, ast.Import) and package_init:
                for alias in node.names:
                    if _is_determined(alias.name, 0):
                        names.add(alias.asname or alias.name.split(".")[0])
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    names.update(_targets(target))
                    if isinstance(target, ast.Name) and target.id == "__all__":
                        names.update(_all_list(node.value))
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                names.update(_targets(node.target))
                if (isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name)
                        and node.target.id == "__all__"):
                    names.update(_all_list(node.value))
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, (ast.If, ast.With)):
                visit(node.body)
                visit(getattr(node, "orelse", []))

    visit(tree.body)
    return names


# -- members of a class ----------------------------------------------------------------------
def _decorators(node: Union[ast.FunctionDef, ast.AsyncFunctionDef]) -> Set[str]:
    names = set()
    for d in node.decorator_list:
        if isinstance(d, ast.Name):
            names.add(d.id)
        elif isinstance(d, ast.Attribute):
            names.add(d.attr)  # "setter" of @name.setter, "abstractmethod" of @abc.abstractmethod
    return names


def class_members(tree: ast.Module, name: str) -> Optional[Tuple[List[str], Dict[str, str]]]:
    """(base class names, {public member: kind}) of class `name` in a parsed file, where kind
    is "method", "property", "settable property" or "attribute" (a plain attribute set in a
    method or in the class body: user code could assign it)."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            break
    else:
        return None
    bases = [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "")
             for b in node.bases]
    members: Dict[str, str] = {}
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            decorators = _decorators(item)
            if "setter" in decorators:
                members[item.name] = "settable property"
            elif decorators & {"property", "cached_property"}:
                members.setdefault(item.name, "property")
            else:
                members[item.name] = "method"
            for sub in ast.walk(item):
                targets = (sub.targets if isinstance(sub, ast.Assign)
                           else [sub.target] if isinstance(sub, (ast.AnnAssign, ast.AugAssign))
                           else [])
                for t in targets:
                    if (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                            and t.value.id == "self" and t.attr not in members):
                        members[t.attr] = "attribute"
        elif isinstance(item, ast.Assign):
            for t in item.targets:
                for n in _targets(t):
                    members[n] = "attribute"
        elif isinstance(item, ast.AnnAssign):
            for n in _targets(item.target):
                members[n] = "attribute"
    public = {n: k for n, k in members.items()
              if not n.startswith("_") or n == "__init__" or n in TOUCHED_PRIVATE.get(name, set())}
    return bases, public


_members_of: Dict[Tuple[str, str], Optional[Tuple[List[str], Dict[str, str]]]] = {}


def class_block(source: str, name: str) -> Optional[str]:
    """The text of top-level class `name` in a file, up to the next top-level statement, so
    only it is parsed (whole files, a thousand lines each, at every release are slow)."""
    match = re.search(rf"^class {re.escape(name)}\b.*?(?=^[^\s#)]|\Z)", source,
                      re.MULTILINE | re.DOTALL)
    return match.group(0) if match else None


def resolve_members(checkout: Path, tag: str, name: str) -> Dict[str, str]:
    """The public members of class `name` at `tag`, its known base classes' included."""
    files = reader(checkout)
    for path in CLASS_FILES.get(name, []):
        sha = files.blob_of.get(f"{tag}:{path}")
        if sha is None:
            continue
        if (sha, name) not in _members_of:
            block = class_block(files.texts[sha], name)
            _members_of[sha, name] = (class_members(ast.parse(block), name)
                                      if block is not None else None)
        found = _members_of[sha, name]
        if found is not None:
            bases, members = found
            merged: Dict[str, str] = {}
            for base in reversed(bases):
                if base != name:
                    merged.update(resolve_members(checkout, tag, base))
            merged.update(members)
            return merged
    return {}


def collect_members(checkout: Path) -> Dict[str, Dict[str, Dict[str, str]]]:
    """{section: {member: {"releases": ..., "assignable": releases it could be assigned in,
    "kinds": what it was}}}."""
    tags = release_tags(checkout)
    labels = [".".join(map(str, version)) for version, _ in tags]
    seen: Dict[str, Dict[str, Dict[str, List[int]]]] = {s: {} for s in CLASSES}
    for index, (_, tag) in enumerate(tags):
        for section, cls in CLASSES.items():
            for member, kind in resolve_members(checkout, tag, cls).items():
                entry = seen[section].setdefault(member, {})
                entry.setdefault("", []).append(index)
                entry.setdefault(kind, []).append(index)
    out: Dict[str, Dict[str, Dict[str, str]]] = {}
    for section, members in seen.items():
        out[section] = {}
        for member, kinds in sorted(members.items()):
            assignable = sorted({*kinds.get("attribute", []),
                                 *kinds.get("settable property", [])})
            out[section][member] = {
                "releases": ranges(kinds[""], labels),
                "assignable": ranges(assignable, labels),
                "kinds": ", ".join(sorted(k for k in kinds if k)),
            }
    return out


def collect(checkout: Path) -> Dict[str, Dict[str, str]]:
    """{module: {name: releases}}, releases as ranges of consecutive release tags."""
    tags = release_tags(checkout)
    if not tags:
        sys.exit(f"{checkout} has no release tags from 0.17 to 0.38 (is it a clone of "
                 "determined-ai/determined with its tags?)")
    seen: Dict[str, Dict[str, List[int]]] = {m: {} for m in MODULE_FILES}
    exports: Dict[int, Set[str]] = {}  # by parsed file: most are the same across releases
    for index, (_, tag) in enumerate(tags):
        for module, paths in MODULE_FILES.items():
            for path in paths:
                tree = reader(checkout).tree(tag, path)
                if tree is not None:
                    if id(tree) not in exports:
                        exports[id(tree)] = exported_names(
                            tree, path.endswith("__init__.py") or path in REEXPORTING_FILES)
                    for name in exports[id(tree)]:
                        seen[module].setdefault(name, []).append(index)
                    break
    labels = [".".join(map(str, version)) for version, _ in tags]
    return {module: {name: ranges(indices, labels) for name, indices in sorted(names.items())}
            for module, names in seen.items()}


def ranges(indices: List[int], labels: List[str]) -> str:
    """'0.17.0-0.38.1' for an unbroken run of releases, runs joined by ', '."""
    runs: List[List[int]] = []
    for i in indices:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(labels[r[0]] if len(r) == 1 else f"{labels[r[0]]}-{labels[r[-1]]}"
                     for r in runs)


# -- the page ------------------------------------------------------------------------------
HEADING = re.compile(r"^## (module|class|object) `([^`]+)`\s*$")
ROW = re.compile(r"^\| `([^`]+)` \|(.*)\|\s*$")


def assignable_mark(member: Dict[str, str]) -> str:
    """The page's assignable column for a member of the data file."""
    if member["assignable"]:
        return "yes"
    return "-" if member["kinds"] == "method" else "no"


def fill_doc(text: str, data: Dict[str, Dict]) -> str:
    """The page with the releases (and assignable) columns of every listed name set from the
    data file, and a row with status `unclassified` appended to a table for each name of the
    data file it lacks. Names the data file does not have keep their columns."""
    modules, members = data["modules"], data["members"]
    out: List[str] = []
    section: Optional[str] = None
    listed: Set[str] = set()

    def known() -> Dict[str, Dict[str, str]]:
        if section in modules:
            return {n: {"releases": r} for n, r in modules[section].items()}
        return members.get(section or "", {})

    lines = text.splitlines()
    for i, line in enumerate(lines):
        heading = HEADING.match(line)
        row = ROW.match(line)
        if heading:
            section, listed = heading.group(2), set()
        elif row and section is not None:
            name = row.group(1)
            cells = [c.strip() for c in row.group(2).split(" | ")]
            listed.add(name)
            entry = known().get(name)
            if entry is not None:
                cells[1] = entry["releases"]
                if len(cells) == 4 and "assignable" in entry:
                    cells[2] = assignable_mark(entry)
            line = f"| `{name}` | " + " | ".join(cells) + " |"
        out.append(line)
        table_ends = row is not None and (i + 1 == len(lines) or not ROW.match(lines[i + 1]))
        if table_ends and section is not None:
            for name, entry in known().items():
                if name not in listed:
                    extra = f" {assignable_mark(entry)} |" if "assignable" in entry else ""
                    out.append(f"| `{name}` | unclassified | {entry['releases']} |{extra} "
                               "to decide |")
            listed = set(known())  # once per table
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkout", type=Path, help="a clone of determined-ai/determined")
    parser.add_argument("--check", action="store_true",
                        help="compare with the data file instead of writing it")
    parser.add_argument("--doc", action="store_true",
                        help="also fill the releases column of docs/determined-api.md")
    parser.add_argument("--out", type=Path, default=DATA, help="the data file")
    args = parser.parse_args()
    data: Dict[str, Dict[str, Any]] = {"modules": collect(args.checkout),
                                       "members": collect_members(args.checkout)}
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    if args.check:
        if not args.out.exists() or args.out.read_text() != text:
            print(f"{args.out} differs from what {args.checkout} exports; rerun without "
                  "--check to regenerate it", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    if args.doc:
        DOC.write_text(fill_doc(DOC.read_text(), data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
