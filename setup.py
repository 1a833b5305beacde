"""The wheel's package list, found rather than written out; everything else is pyproject.toml's.

setuptools' `[tool.setuptools.packages.find]` finds packages under folders but cannot ship one
under another name, and `state/` (the on-disk formats: schemas, migrations) ships inside
localdet as `localdet.state`. tests/test_installed_wheel.py checks that the wheel holds every
module of the checkout.
"""

from setuptools import find_namespace_packages, setup


def found(where: str, name: str) -> list[str]:
    # Namespace discovery: the folders of data files (web/static, migrations) count as
    # packages too, as Python sees them, so setuptools does not warn that it leaves them out.
    return find_namespace_packages(where, include=[name, f"{name}.*"],
                                   exclude=["*.__pycache__"])


setup(
    packages=[
        *found(".", "localdet"),
        *found("harness", "determined"),
        *(f"localdet.{name}" for name in found(".", "state")),
    ],
    # Subpackages follow their parent's folder (determined.core: harness/determined/core).
    package_dir={"determined": "harness/determined", "localdet.state": "state"},
)
