"""localdet: Determined's Keras training platform on one machine."""

# The one version source: pyproject.toml reads it for the wheel's metadata
# ([tool.setuptools.dynamic]); `localdet --version`, `det version` and the dashboard show it.
__version__ = "0.1.0"
