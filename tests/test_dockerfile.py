"""The GPU image's Dockerfile names only what exists: a module or package that moves breaks
this test, not a user's `docker build` (its self-check imported `localdet.engines` long
after that module had moved)."""

from __future__ import annotations

import importlib
import re
import shlex
import tomllib

from conftest import REPO

DOCKERFILE = (REPO / "Dockerfile").read_text()
# Provided by NVIDIA's TensorFlow container itself; the Dockerfile must not reinstall them.
FROM_THE_CONTAINER = {"tensorflow", "keras", "tf-keras", "tensorboard", "ml-dtypes"}


def _requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower()


def test_every_copy_source_exists():
    sources = [shlex.split(line)[1:-1] for line in DOCKERFILE.splitlines()
               if line.startswith("COPY ")]
    assert sources, "no COPY lines found"
    for source in (s for group in sources for s in group if not s.startswith("--")):
        assert (REPO / source).exists(), f"the Dockerfile copies {source}, which is not there"


def test_its_self_checks_import_what_exists():
    imports = re.findall(r"from (\w+(?:\.\w+)*) import (\w+)", DOCKERFILE)
    assert imports, "no `python -c` import found in the self-check"
    for module, name in imports:
        if module.split(".")[0] != "localdet":
            continue  # importlib.metadata and the like: the standard library
        assert hasattr(importlib.import_module(module), name), f"{module} has no {name}"


def test_it_installs_every_dependency_pyproject_names():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    wanted = {_requirement_name(r) for r in pyproject["project"]["dependencies"]}
    installed = {_requirement_name(r) for r in re.findall(r'"([A-Za-z0-9_.\-\[\]]+[<>=~][^"]*)"',
                                                         DOCKERFILE)}
    missing = wanted - FROM_THE_CONTAINER - installed
    assert not missing, f"the Dockerfile's pip install lacks {sorted(missing)}"


def test_the_cpu_variant_passes_only_what_the_dockerfile_declares():
    """scripts/cpu-image builds the CPU variant from this Dockerfile: its build arguments must
    be ARGs here, and the TensorFlow it installs must be what NVIDIA's container provides."""
    script = (REPO / "scripts" / "cpu-image").read_text()
    declared = set(re.findall(r"^ARG (\w+)", DOCKERFILE, re.MULTILINE))
    passed = set(re.findall(r"--build-arg (\w+)=", script))
    assert {"BASE", "TENSORFLOW", "HOROVOD"} <= passed, passed
    assert passed <= declared, f"scripts/cpu-image passes {sorted(passed - declared)}, " \
                               "which the Dockerfile does not declare"
    installed = re.search(r"names = \{([^}]*)\}", script)
    assert installed, "scripts/cpu-image no longer names the TensorFlow packages it installs"
    assert set(re.findall(r'"([\w-]+)"', installed.group(1))) == FROM_THE_CONTAINER
