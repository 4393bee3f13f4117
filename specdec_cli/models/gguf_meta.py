"""Read a GGUF file's metadata without loading its weights, and fingerprint its vocabulary.

Pure Python on purpose: `specdec models` must answer "which drafter fits this target?" without
llama.cpp and in well under a second per file. Only the header, the key/value pairs and the
tensor descriptions are read; the tensor data is never touched.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..errors import ModelFileError
from ..json_cache import read_json_cache, write_json_cache

GGUF_MAGIC = b"GGUF"
# llama.cpp compares drafter and target vocabularies from this token id on (the first few
# ids are special tokens that fine-tunes sometimes rename without changing the tokenizer).
# compat.check_compatible (loaded models) and the fingerprint below (files) both use it.
FIRST_COMPARED_TOKEN = 5

# GGUF value types -> struct format of one scalar. 8 (string) and 9 (array) are variable-size.
_SCALAR_FORMATS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
# Keys whose values we keep; everything else is skipped without building Python objects.
_WANTED_KEYS = {
    "general.architecture",
    "general.name",
    "tokenizer.ggml.model",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.add_bos_token",
}


@dataclass(frozen=True)
class GGUFInfo:
    """What specdec needs to know about a model file before loading it."""

    architecture: str
    name: str | None
    tokenizer_model: str | None
    tokens: tuple[str, ...]
    bos_token_id: int | None
    eos_token_id: int | None
    add_bos_token: bool | None
    context_length: int | None
    parameter_count: int
    file_size: int

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def vocab_fingerprint(self) -> str:
        """SHA-256 over what decides whether two models can share draft tokens."""
        digest = hashlib.sha256()
        header = f"{self.tokenizer_model}|bos={self.bos_token_id}|eos={self.eos_token_id}|"
        digest.update(header.encode())
        for token in self.tokens[FIRST_COMPARED_TOKEN:]:
            digest.update(token.encode("utf-8", "surrogatepass") + b"\0")
        return digest.hexdigest()


def read_gguf_info(path: Path) -> GGUFInfo:
    """Parse the metadata of the GGUF file at `path`; raise ModelFileError if it is not one."""
    try:
        with open(path, "rb") as f:
            return _read_info(f, path)
    except (OSError, struct.error, UnicodeDecodeError, ValueError) as e:
        raise ModelFileError(
            f"Cannot read GGUF metadata from {path}: {e}.",
            "Check that it is a complete GGUF model; for registry models re-run `specdec pull`.",
        ) from e


def _read_info(f: BinaryIO, path: Path) -> GGUFInfo:
    if f.read(4) != GGUF_MAGIC:
        raise ValueError("not a GGUF file (bad magic)")
    version = _unpack(f, "<I")
    if version < 2:
        raise ValueError(f"GGUF version {version} is too old (need 2 or later)")
    tensor_count, kv_count = _unpack(f, "<Q"), _unpack(f, "<Q")
    values = _read_key_values(f, kv_count)
    arch = str(values.get("general.architecture", "unknown"))
    return GGUFInfo(
        architecture=arch,
        name=values.get("general.name"),
        tokenizer_model=values.get("tokenizer.ggml.model"),
        tokens=tuple(values.get("tokenizer.ggml.tokens", ())),
        bos_token_id=values.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=values.get("tokenizer.ggml.eos_token_id"),
        add_bos_token=values.get("tokenizer.ggml.add_bos_token"),
        context_length=values.get(f"{arch}.context_length"),
        parameter_count=_count_parameters(f, tensor_count),
        file_size=path.stat().st_size,
    )


def _read_key_values(f: BinaryIO, kv_count: int) -> dict:
    values: dict = {}
    for _ in range(kv_count):
        key = _read_string(f)
        value_type = _unpack(f, "<I")
        keep = key in _WANTED_KEYS or key.endswith(".context_length")
        value = _read_value(f, value_type, keep)
        if keep:
            values[key] = value
    return values


def _read_value(f: BinaryIO, value_type: int, keep: bool):
    if value_type in _SCALAR_FORMATS:
        return _unpack(f, _SCALAR_FORMATS[value_type])
    if value_type == _STRING:
        return _read_string(f) if keep else _skip_string(f)
    if value_type == _ARRAY:
        return _read_array(f, keep)
    raise ValueError(f"unknown GGUF value type {value_type}")


def _read_array(f: BinaryIO, keep: bool):
    item_type, count = _unpack(f, "<I"), _unpack(f, "<Q")
    if item_type in _SCALAR_FORMATS and not keep:
        f.seek(struct.calcsize(_SCALAR_FORMATS[item_type]) * count, 1)
        return None
    items = [_read_value(f, item_type, keep) for _ in range(count)]
    return items if keep else None


def _count_parameters(f: BinaryIO, tensor_count: int) -> int:
    total = 0
    for _ in range(tensor_count):
        _skip_string(f)
        n_dims = _unpack(f, "<I")
        elements = 1
        for _ in range(n_dims):
            elements *= _unpack(f, "<Q")
        f.seek(4 + 8, 1)  # ggml type, data offset
        total += elements
    return total


def _read_string(f: BinaryIO) -> str:
    length = _unpack(f, "<Q")
    return f.read(length).decode("utf-8", "surrogateescape")


def _skip_string(f: BinaryIO) -> None:
    f.seek(_unpack(f, "<Q"), 1)


def _unpack(f: BinaryIO, fmt: str):
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise ValueError("file ends inside the metadata (truncated download?)")
    return struct.unpack(fmt, data)[0]


class FingerprintCache:
    """Vocabulary fingerprints in a JSON file, keyed by path, size and modification time."""

    def __init__(self, cache_file: Path) -> None:
        self.cache_file = cache_file

    def fingerprint(self, model: Path) -> str:
        stat = model.stat()
        key = f"{model.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
        known = read_json_cache(self.cache_file)
        if key not in known:
            known[key] = read_gguf_info(model).vocab_fingerprint()
            write_json_cache(self.cache_file, known)
        return known[key]
