"""Small files for the registry and fetch tests: GGUF models of a few KB, wheels, registries."""

from __future__ import annotations

import base64
import hashlib
import re
import zipfile
from pathlib import Path

import gguf
import numpy as np

VOCAB_A = ["<unk>", "<s>", "</s>", "<pad>", "<mask>"] + [f"tok{i}" for i in range(40)]
VOCAB_B = ["<unk>", "<s>", "</s>", "<pad>", "<mask>"] + [f"word{i}" for i in range(40)]


def write_gguf(
    path: Path, tokens: list[str], *, n_params: int = 64, arch: str = "llama", seed: int = 0
) -> Path:
    """A metadata-complete GGUF with one small tensor (not loadable by llama.cpp, not needed)."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(path.stem)
    writer.add_context_length(256)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * len(tokens))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_string("tokenizer.chat_template", "{{ messages }}")
    rng = np.random.default_rng(seed)
    writer.add_tensor("weights", rng.standard_normal(n_params).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_wheel(directory: Path, package: str, version: str, files: dict[str, bytes]) -> Path:
    """A valid py3-none-any wheel holding `files` (path inside the wheel -> bytes)."""
    norm = re.sub(r"[-_.]+", "_", package).lower()
    info = f"{norm}-{version}.dist-info"
    contents = dict(files)
    contents[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n".encode()
    )
    contents[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: specdec-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = [f"{p},sha256={_record_hash(d)},{len(d)}" for p, d in contents.items()]
    record.append(f"{info}/RECORD,,")
    wheel = directory / f"{norm}-{version}-py3-none-any.whl"
    directory.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in contents.items():
            zf.writestr(name, data)
        zf.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return wheel


def _record_hash(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def publish_to_simple_index(index: Path, wheel: Path, package: str) -> None:
    """Put `wheel` in a PEP 503 file:// index (index/<project>/index.html) like a mirror."""
    project = index / re.sub(r"[-_.]+", "-", package).lower()
    project.mkdir(parents=True, exist_ok=True)
    target = project / wheel.name
    target.write_bytes(wheel.read_bytes())
    links = "".join(f'<a href="{w.name}">{w.name}</a>\n' for w in sorted(project.glob("*.whl")))
    (project / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")


def split(data: bytes, n: int) -> list[bytes]:
    step = -(-len(data) // n)
    return [data[i * step : (i + 1) * step] for i in range(n)]
