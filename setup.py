"""The wheel's package list, found rather than written out; everything else is pyproject.toml's.

setuptools' `[tool.setuptools.packages.find]` finds packages under folders but cannot ship one
under another name, and `state/` (the on-disk formats: schemas, migrations) ships inside
localdet as `localdet.state`. tests/test_installed_wheel.py checks that the wheel holds every
module of the checkout.
"""

from setuptools import find_packages, setup

setup(
    packages=[
        *find_packages(".", include=["localdet", "localdet.*"]),
        *find_packages("harness", include=["determined", "determined.*"]),
        *(f"localdet.{name}" for name in find_packages(".", include=["state", "state.*"])),
    ],
    # Subpackages follow their parent's folder (determined.core: harness/determined/core).
    package_dir={"determined": "harness/determined", "localdet.state": "state"},
)
