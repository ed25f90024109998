"""The package version."""

__version__ = "0.3.0"
