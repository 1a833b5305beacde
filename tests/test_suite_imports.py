"""The suite imports its shared modules (conftest, browser) by their own names, never as a
top-level `tests` package: an installed distribution that ships one (keras-multi-head does)
would shadow it."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

from conftest import REPO


def test_no_test_module_imports_a_top_level_tests_package():
    found = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            found += [f"{path.relative_to(REPO)}:{node.lineno}" for name in names
                      if name == "tests" or name.startswith("tests.")]
    assert not found, f"import these by their own names (from conftest import ...): {found}"


def test_an_installed_tests_package_shadows_nothing(tmp_path):
    shadow = tmp_path / "site" / "tests"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('the installed tests package')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    # Files that import conftest and browser, at the top and in a sub-folder.
    targets = ["tests/test_dockerfile.py", "tests/test_custom_search.py",
               "tests/sdk_cli/test_web_manage.py"]
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0",
                           "--collect-only", "-q", *targets], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
