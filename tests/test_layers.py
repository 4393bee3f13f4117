"""Imports point down only (the house style): each layer may import the ones below it,
never one above; lazy imports inside functions count too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "specdec_cli"
# Top to bottom. `request` (what a command asks for) is shared by the commands and the
# loader, so it sits below both and above the engine whose settings it builds; the other
# modules at the package's top level but cli and render* are small shared pieces at the
# bottom (errors, paths, json_cache ...).
LAYERS = ["edges", "adapters", "commands", "views", "services", "models", "llama", "request"]
LAYERS += ["decoding", "shared"]
FOLDERS = {"bench": "adapters", "serve": "adapters", "commands": "commands"}
FOLDERS |= {"services": "services"}
FOLDERS |= {"models": "models", "llama": "llama", "decoding": "decoding", "request": "request"}
EDGES = {"cli", "__main__"}
# The terminal views the commands and adapters print through: below them, above what they show.
VIEWS = {"render", "render_fetch", "render_chat"}
ALLOWED_UPWARDS: dict[str, set[str]] = {}  # none


def layer_of(module: str) -> str:
    """`module`: dotted, inside the package (e.g. 'models.loading')."""
    first = module.split(".")[0]
    if first in FOLDERS:
        return FOLDERS[first]
    if first in VIEWS:
        return "views"
    return "edges" if first in EDGES else "shared"


def imported_modules(path: Path) -> set[str]:
    """The package's modules `path` imports, dotted, relative to the package."""
    own = path.relative_to(PACKAGE).with_suffix("").parts
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = list(own[: len(own) - node.level])
            target = [*base, *(node.module.split(".") if node.module else [])]
            names = [alias.name for alias in node.names]
            found |= {
                ".".join([*target, n]) if not node.module else ".".join(target) for n in names
            }
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specdec_cli."):
            found.add(node.module.removeprefix("specdec_cli."))
    return found


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_module_imports_no_layer_above_its_own(path):
    layer = layer_of(".".join(path.relative_to(PACKAGE).with_suffix("").parts))
    allowed = ALLOWED_UPWARDS.get(layer, set())
    above = {
        module
        for module in imported_modules(path)
        if LAYERS.index(layer_of(module)) < LAYERS.index(layer) and module not in allowed
    }
    assert not above, f"{path.name} imports from a layer above it: {sorted(above)}"


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch):
    # the layout before issue 27: models/loading.py imported commands/cost_cache.py, lazily
    fake = tmp_path / "specdec_cli" / "models" / "loading.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("def f():\n    from ..services.cost_cache import pair_costs\n")
    monkeypatch.setattr(f"{__name__}.PACKAGE", tmp_path / "specdec_cli")
    assert imported_modules(fake) == {"services.cost_cache"}
    with pytest.raises(AssertionError, match="services.cost_cache"):
        test_a_module_imports_no_layer_above_its_own(fake)
