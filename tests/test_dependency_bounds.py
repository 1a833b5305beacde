"""The installed dependencies lie inside the bounds localdet's metadata declares: where the
code reaches into a library's private parts (keras.src, tensorflow.python, tf_keras.src,
rich's cell measuring, sqlite-utils' Database internals) pyproject.toml bounds it above at
the next release not yet checked, and an upgrade past a bound fails here, loudly, instead
of in a user's trial."""

from __future__ import annotations

import tomllib
from importlib import metadata

from conftest import REPO
from packaging.requirements import Requirement

# The libraries whose private parts the code uses; each place says which version it was
# checked against.
REACHED_INTO = {"tensorflow", "keras", "tf-keras", "rich", "sqlite-utils"}


def declared() -> list[Requirement]:
    """localdet's unconditional requirements, as its installed metadata declares them."""
    return [r for r in map(Requirement, metadata.requires("localdet") or [])
            if r.marker is None]


def test_the_installed_metadata_declares_what_pyproject_says():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert sorted(map(str, declared())) == sorted(str(Requirement(r)) for r in pyproject), \
        "localdet's installed metadata is older than pyproject.toml: reinstall (scripts/test)"


def test_every_library_reached_into_has_an_upper_bound():
    bounded = {r.name for r in declared() if any(s.operator in ("<", "<=", "==", "~=")
                                                 for s in r.specifier)}
    assert REACHED_INTO <= bounded, f"no upper bound for {sorted(REACHED_INTO - bounded)}"


def test_the_installed_versions_lie_inside_the_declared_bounds():
    outside = []
    for requirement in declared():
        version = metadata.version(requirement.name)
        if not requirement.specifier.contains(version, prereleases=True):
            outside.append(f"{requirement.name} {version} (localdet declares "
                           f"{requirement.specifier})")
    assert not outside, "installed outside localdet's bounds: " + "; ".join(outside)
