"""The built wheel, installed as people install it (`pip install .`, `pipx install`, the
image), not the editable checkout the rest of the suite runs against.

The wheel and the sdist are built from a copy of the checkout (`python -m build`: the wheel
from the sdist, so the sdist is complete too) and checked with `twine check`. The wheel goes
into a fresh virtual environment whose only other path is the test environment's
site-packages, for the dependencies (TensorFlow is not downloaded again): a `.pth` line adds
that folder without running the editable install's own `.pth` files in it, so `localdet` and
`determined` can come from nowhere but the wheel. There every module is imported, the
commands answer, the versions agree, the dashboard serves its pages and the bundled example
trains to COMPLETED.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest
import yaml
from browser import free_port
from conftest import EXAMPLE, REPO, wait_for

import localdet

pytestmark = pytest.mark.slow

# What the wheel is built from; state/ ships as localdet/state.
SOURCES = ["pyproject.toml", "setup.py", "README.md", "LICENSE", "localdet", "harness", "state"]
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")

IMPORT_EVERYTHING = """
import importlib, json, pkgutil, sys
names = []
for top in ("localdet", "determined"):
    names.append(top)
    package = importlib.import_module(top)
    names += [m.name for m in pkgutil.walk_packages(package.__path__, top + ".")]
files = {}
for name in names:
    if not name.endswith(".__main__"):  # `python -m localdet`: the command line itself
        files[name] = importlib.import_module(name).__file__
print(json.dumps({"files": files, "path": sys.path}))
"""


def checkout_modules() -> set[str]:
    """Every module of the checkout, as the wheel must name it."""
    found = set()
    for root, name in ((REPO, "localdet"), (REPO / "harness", "determined"),
                       (REPO, "state")):
        for path in (root / name).rglob("*.py"):
            if "__pycache__" in path.parts or not (path.parent / "__init__.py").is_file():
                continue  # state/migrations/*.py are data: read by path, never imported
            parts = path.relative_to(root).with_suffix("").parts
            if name == "state":
                parts = ("localdet", *parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found.add(".".join(parts))
    return found


def checkout_files() -> set[str]:
    """The checkout's files under the packages, as the wheel must hold them."""
    found = set()
    for folder, inside in ((REPO / "localdet", "localdet"), (REPO / "harness" / "determined",
                           "determined"), (REPO / "state", "localdet/state")):
        for path in folder.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                found.add(f"{inside}/{path.relative_to(folder).as_posix()}")
    return found


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The sdist and the wheel, built from a copy of the checkout and checked by twine."""
    source = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=IGNORED)
        else:
            shutil.copy2(REPO / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    # No build isolation: the test environment's setuptools (the test extra's), no download.
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", out,
                            source], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    [wheel], [sdist] = out.glob("*.whl"), out.glob("*.tar.gz")
    checked = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", wheel, sdist],
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count("PASSED") == 2, checked.stdout
    return out


@pytest.fixture(scope="module")
def venv(dist, tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel installed, the test environment's
    site-packages appended for the dependencies only."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--clear", venv], check=True,
                   timeout=120)
    [wheel] = dist.glob("*.whl")
    # Installed before the dependencies' folder is added: pip sees no other localdet.
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install",
         "--no-deps", "--no-index", "--no-compile", "--quiet", wheel],
        capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    [site_packages] = (venv / "lib").glob("python3*/site-packages")
    (site_packages / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def fresh_env(home: Path) -> dict:
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return {**env, "LOCALDET_HOME": str(home), "TF_CPP_MIN_LOG_LEVEL": "2",
            "PYTHONNOUSERSITE": "1"}


def in_venv(venv: Path, command: str, *args, cwd: Path, timeout: float = 120,
            home: Path | None = None) -> subprocess.CompletedProcess:
    """A command of the fresh environment, run outside the checkout (no `localdet` in cwd)."""
    result = subprocess.run([str(venv / "bin" / command), *map(str, args)], cwd=cwd,
                            env=fresh_env(home or cwd / "home"), capture_output=True,
                            text=True, timeout=timeout)
    assert result.returncode == 0, f"{command} {args}:\n{result.stdout}\n{result.stderr}"
    return result


def test_the_wheel_holds_every_file_of_the_packages(dist):
    [wheel] = dist.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
        fields = archive.read(metadata).decode()
    shipped = {n for n in names if ".dist-info/" not in n}
    assert shipped == checkout_files()
    assert f"\nVersion: {localdet.__version__}\n" in fields
    assert "Classifier: Operating System :: POSIX :: Linux" in fields
    assert "Description-Content-Type: text/markdown" in fields
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    with zipfile.ZipFile(wheel) as archive:
        assert "localdet = localdet.ui.cli:main" in archive.read(entry_points).decode()


def test_every_module_imports_from_the_installed_wheel(venv, tmp_path):
    result = in_venv(venv, "python", "-c", IMPORT_EVERYTHING, cwd=tmp_path)
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(facts["files"]) | {"localdet.__main__"} == checkout_modules()
    for name, file in facts["files"].items():
        assert Path(file).is_relative_to(venv), f"{name} imported from {file}"
    assert not {str(REPO), str(REPO / "harness")} & set(facts["path"])


def test_the_installed_commands_answer_with_one_version(venv, tmp_path):
    version = localdet.__version__
    assert in_venv(venv, "localdet", "--version", cwd=tmp_path).stdout == f"localdet {version}\n"
    assert f"version: {version} (localdet)" in in_venv(venv, "det", "version", cwd=tmp_path).stdout
    assert in_venv(venv, "det", "--version", cwd=tmp_path).stdout.startswith(f"det {version} ")
    assert "Usage: localdet" in in_venv(venv, "localdet", "--help", cwd=tmp_path).stdout
    assert "Usage: det" in in_venv(venv, "det", "--help", cwd=tmp_path).stdout
    metadata = in_venv(venv, "python", "-c", "import importlib.metadata as m, localdet; "
                       "print(m.version('localdet'), localdet.__file__)", cwd=tmp_path)
    assert metadata.stdout.split()[0] == version
    assert Path(metadata.stdout.split()[1]).is_relative_to(venv)


def test_the_installed_dashboard_serves_its_pages_and_version(venv, tmp_path, processes):
    port = free_port()
    (tmp_path / "home").mkdir()
    server = processes([venv / "bin" / "localdet", "web", "--port", port, "--no-token"],
                       cwd=tmp_path, env=fresh_env(tmp_path / "home"),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"

    def get(path: str) -> bytes | None:
        try:
            with urllib.request.urlopen(base + path, timeout=30) as response:
                return response.read()
        except (urllib.error.URLError, ConnectionError):
            return None

    facts = wait_for(lambda: get("/api/daemon"), 60, "the installed dashboard", 0.2)
    assert json.loads(facts)["version"] == localdet.__version__
    assert b"/static/app.js" in get("/")  # the package data: the page and its scripts
    assert b"daemon.version" in get("/static/app.js")
    server.terminate()
    server.wait(timeout=30)


def test_the_bundled_example_trains_to_completed_through_the_installed_localdet(venv,
                                                                                tmp_path):
    config = yaml.safe_load((EXAMPLE / "const.yaml").read_text())
    config["searcher"]["max_length"] = {"batches": 8}
    config["min_validation_period"] = {"batches": 8}
    config["min_checkpoint_period"] = {"batches": 8}
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(config))
    in_venv(venv, "localdet", "run", "--quiet", tmp_path / "tiny.yaml", EXAMPLE, cwd=tmp_path,
            timeout=300)
    [experiment] = json.loads(in_venv(venv, "localdet", "status", "--json",
                                      cwd=tmp_path).stdout)
    assert experiment["state"] == "COMPLETED", experiment
    [best] = json.loads(in_venv(venv, "localdet", "checkpoints", experiment["id"], "--best",
                                "--json", cwd=tmp_path).stdout)
    assert best["batches_trained"] == 8
