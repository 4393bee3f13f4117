"""The `requantize` source: a registry model made on this machine from another one (the default
drafter, SmolLM2's Q4_1 layers as Q8_0), by llama.cpp's quantiser, on tiny models."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
import yaml

from specdec_cli.errors import FetchError, ModelFileError
from specdec_cli.llama import library, model_file
from specdec_cli.models.fetch import fetch_entry
from specdec_cli.models.fetch_progress import SilentProgress
from specdec_cli.models.model_status import model_statuses
from specdec_cli.models.pypi import joined_path
from specdec_cli.models.registry import REQUANT_QUANTS, load_registry


class Notes(SilentProgress):
    """A FetchProgress that keeps its notes."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def note(self, message: str) -> None:
        self.notes.append(message)


@pytest.fixture
def registry_file(tiny_models, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    path = tmp_path / "models.yaml"
    published = {"family": "tiny", "role": "drafter", "params": "0.5M"}
    models = {
        "published": {**published, "sources": [{"path": str(tiny_models.close_drafter)}]},
        "copy": {**published, "sources": [{"requantize": {"from": "published", "quant": "q8_0"}}]},
    }
    path.write_text(yaml.safe_dump({"version": 1, "models": models}))
    return path


def tensor_types(path: Path) -> set[str]:
    return {t.tensor_type.name for t in gguf.GGUFReader(path).tensors if len(t.shape) > 1}


def test_the_copy_is_made_once_from_the_published_file(registry_file, tiny_models):
    entry = load_registry(registry_file).lookup("copy")
    progress = Notes()

    made = fetch_entry(entry, progress=progress)

    assert made == joined_path(entry) and made.read_bytes()[:4] == b"GGUF"
    assert tensor_types(made) == {"Q8_0"} != tensor_types(tiny_models.close_drafter)
    assert progress.notes == ["copy: requantising published to Q8_0."]
    written = made.stat().st_mtime_ns
    assert fetch_entry(entry, progress=progress) == made  # present: used as it is
    assert made.stat().st_mtime_ns == written and len(progress.notes) == 1


def test_offline_the_copy_is_made_from_a_published_file_on_disk(registry_file, tmp_path):
    entry = load_registry(registry_file).lookup("copy")
    published = str(entry.sources[0].parent.sources[0].path)
    elsewhere = tmp_path / "elsewhere.yaml"
    elsewhere.write_text(registry_file.read_text().replace(published, "/no/such.gguf"))
    with pytest.raises(FetchError, match="offline mode is on"):
        fetch_entry(load_registry(elsewhere).lookup("copy"), offline=True)

    assert fetch_entry(entry, offline=True) == joined_path(entry)


def test_a_failed_requantisation_leaves_nothing_that_passes_as_the_copy(registry_file, monkeypatch):
    entry = load_registry(registry_file).lookup("copy")
    failing = library.llama_cpp.llama_model_quantize
    monkeypatch.setattr(library.llama_cpp, "llama_model_quantize", lambda *args: 1)
    with pytest.raises(ModelFileError, match="could not requantise"):
        fetch_entry(entry)
    assert list(joined_path(entry).parent.iterdir()) == []
    monkeypatch.setattr(library.llama_cpp, "llama_model_quantize", failing)
    assert fetch_entry(entry).is_file()


def test_the_registry_names_the_types_the_quantiser_is_given():
    assert set(REQUANT_QUANTS) == set(model_file.QUANT_TYPES)


def test_the_models_list_sizes_a_copy_by_its_file_once_made(registry_file):
    registry = load_registry(registry_file)
    size = {s.name: s.size for s in model_statuses(registry)}
    assert size["copy"] is None  # the registry cannot know it before the copy exists
    made = fetch_entry(registry.lookup("copy"))
    assert {s.name: s.size for s in model_statuses(registry)}["copy"] == made.stat().st_size
