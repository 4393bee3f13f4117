"""Where specdec keeps its files: everything under $SPECDEC_HOME when it is set, else the
XDG folders (caches in ~/.cache/specdec, the user's models.yaml in ~/.config/specdec)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Decode costs, file hashes, vocabulary fingerprints, models joined from PyPI."""
    return _specdec_dir("XDG_CACHE_HOME", ".cache")


def config_dir() -> Path:
    """The user's models.yaml."""
    return _specdec_dir("XDG_CONFIG_HOME", ".config")


def _specdec_dir(xdg_variable: str, default: str) -> Path:
    if os.environ.get("SPECDEC_HOME"):
        return Path(os.environ["SPECDEC_HOME"]).expanduser()
    return Path(os.environ.get(xdg_variable) or Path.home() / default) / "specdec"
