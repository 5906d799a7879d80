"""The package version (read by setuptools from pyproject's dynamic version)."""

__version__ = "0.3.0"
