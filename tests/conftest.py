"""Shared pytest fixtures."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

# ---- tiny GGUF models (tests/tiny_gguf.py) -------------------------------------------------
from tiny_gguf import TinyModels, build_tiny_models  # noqa: E402


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    """Tiny llama GGUFs written once per session (~0.1 s); see tiny_gguf.TinyModels.

    Paths: .target, .close_drafter, .unrelated_drafter, .incompatible, .oversized,
    .padded_drafter, .gqa_drafter, .soft_target, .soft_drafter.
    """
    return build_tiny_models(tmp_path_factory.mktemp("tiny_gguf"))


# ---- end tiny GGUF models ------------------------------------------------------------------
