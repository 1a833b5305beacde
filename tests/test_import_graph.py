"""The shape of the import graph: no circles in `localdet` and `determined` (an import
anywhere in a module counts, inside functions too), and `determined` reaches the daemon side
only through the reporter entry point, never by importing `localdet`."""

from __future__ import annotations

import ast
import importlib.metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"localdet": REPO / "localdet", "determined": REPO / "harness" / "determined"}


def modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of both packages (a package by its __init__)."""
    found = {}
    for package, root in PACKAGES.items():
        for path in root.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join([package, *(p for p in parts if p != "__init__")])] = path
    return found


def imported_names(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every dotted name the module imports, absolute. `from a import b` names the module
    `a.b` when there is one, else `a`: importing a submodule from within its own package
    (`from determined.keras import _engine` in determined.keras._context) is no circle."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, up level - 1 packages
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                package = package[:len(package) - node.level + 1]
                base = ".".join(package + ([node.module] if node.module else []))
            for alias in node.names:
                names.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return names


def graph() -> dict[str, set[str]]:
    """Module -> the modules of both packages it imports (the longest known prefix of each
    imported name)."""
    known = modules()
    edges = {}
    for name, path in known.items():
        targets = set()
        for imported in imported_names(name, path, known):
            while imported and imported not in known:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        edges[name] = targets
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None; depth first, without recursion."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" once left
    for start in sorted(edges):
        if start in state:
            continue
        path, stack = [start], [iter(sorted(edges[start]))]
        state[start] = "open"
        while stack:
            target = next(stack[-1], None)
            if target is None:
                state[path.pop()] = "done"
                stack.pop()
            elif state.get(target) == "open":
                return path[path.index(target):] + [target]
            elif target not in state:
                state[target] = "open"
                path.append(target)
                stack.append(iter(sorted(edges[target])))
    return None


def test_the_graph_sees_both_packages():
    edges = graph()
    assert "localdet.records.db" in edges and "determined.core._reporting" in edges
    # `from determined.core import`
    assert "determined.core" in edges["localdet.reporting.sqlite_reporter"]
    assert "localdet.records.states" in edges["localdet.records.db"]


def test_find_cycle_reports_the_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_cycles():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_determined_does_not_import_localdet():
    offenders = sorted(f"{name} imports {target}" for name, targets in graph().items()
                       if name.startswith("determined") for target in targets
                       if target.startswith("localdet"))
    assert not offenders, "; ".join(offenders)


def test_localdet_is_installed_as_the_reporter_factory():
    from determined.core._reporting import REPORTER_GROUP, reporter_factory

    found = importlib.metadata.entry_points(group=REPORTER_GROUP)
    assert [ep.value for ep in found] == ["localdet.reporting.factory:LocaldetReporterFactory"]
    from localdet.reporting.factory import LocaldetReporterFactory

    assert isinstance(reporter_factory(), LocaldetReporterFactory)


def test_without_a_reporter_factory_the_error_says_what_to_install(monkeypatch):
    from determined.core import _reporting

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [])
    _reporting.reporter_factory.cache_clear()
    try:
        with pytest.raises(RuntimeError) as caught:
            _reporting.reporter_factory()
    finally:
        monkeypatch.undo()
        _reporting.reporter_factory.cache_clear()
    assert "pip install localdet" in str(caught.value)
    assert "\n" not in str(caught.value)
