"""Hone Studio's version: the one place it is written (pyproject.toml, `hone --version`, the installers read it)."""

__version__ = "0.1.0"
