"""Shared pytest fixtures."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

# A suite started in the background of a non-interactive shell (`cmd &`, nohup) inherits SIGINT
# ignored, and so would every specdec it starts: the tests that press Ctrl-C would wait on a
# process that never hears it. A handler (unlike SIG_IGN) is reset to the default at exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# ---- caches: each test gets its own; only the real-pair tests see the user's ---------------

CACHE_VARIABLES = ("SPECDEC_HOME", "HF_HOME", "HF_HUB_CACHE")
# Read before any fixture changes them: where the user's downloaded models are.
USER_CACHE_ENVIRONMENT = {name: os.environ.get(name) for name in CACHE_VARIABLES}


def _point_caches_at(directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDEC_HOME", str(directory / "specdec"))
    monkeypatch.setenv("HF_HOME", str(directory / "huggingface"))
    # huggingface_hub reads HF_HOME once, at import; fetch reads HF_HUB_CACHE at each call.
    monkeypatch.setenv("HF_HUB_CACHE", str(directory / "huggingface" / "hub"))
    # A user's history folder never receives the tests' prompts.
    monkeypatch.delenv("SPECDEC_HISTORY", raising=False)


@pytest.fixture(autouse=True, scope="session")
def _session_caches(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Module- and session-scoped fixtures run before per-test fixtures: keep them out of
    the user's caches too."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        _point_caches_at(tmp_path_factory.mktemp("session-caches"), monkeypatch)
        yield


@pytest.fixture(autouse=True)
def _test_caches(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """Every test starts with empty caches of its own (decode costs, hashes, fingerprints,
    models.yaml, the hub cache), never the user's ~/.cache."""
    _point_caches_at(tmp_path_factory.mktemp("caches"), monkeypatch)


def point_caches_at_the_users(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in USER_CACHE_ENVIRONMENT.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)


@pytest.fixture(scope="module")
def shared_model_cache() -> Iterator[None]:
    """The user's own caches, as they were before the tests started, for fixtures that load
    the real models (downloading them there once). Tests themselves still run isolated."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        point_caches_at_the_users(monkeypatch)
        yield


# ---- tiny GGUF models (tests/tiny_gguf.py) -------------------------------------------------
from tiny_gguf import TinyModels, build_tiny_models  # noqa: E402


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    """Tiny llama GGUFs written once per session (~0.1 s); see tiny_gguf.TinyModels.

    Paths: .target, .close_drafter, .unrelated_drafter, .incompatible, .oversized,
    .padded_drafter, .gqa_drafter, .soft_target, .soft_drafter, the quantised targets and
    .endless_target (see tiny_gguf.TinyModels).
    """
    return build_tiny_models(tmp_path_factory.mktemp("tiny_gguf"))


# ---- end tiny GGUF models ------------------------------------------------------------------


@pytest.fixture(params=["aligned", "invariant"])
def exact_prompts(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Exact prompts decoded both ways, whichever this machine chooses
    (library.invariant_prompts): in aligned chunks with llama.cpp's kernels, and with
    the batch-invariant kernels. Both are exact on any CPU; they differ in cost."""
    from specdec_cli.llama import library

    monkeypatch.setattr(library, "_invariant_prompts", request.param == "invariant")
    return request.param
