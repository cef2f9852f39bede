"""A drafter kind is one package that says everything about itself: no kind's name appears outside
its own package (configs, docs, tests and docstrings aside) as a string, an identifier (a name,
attribute, function or class: `BlockPilotDrafter`, `eagle3_objective`) or an import path
(`specblock_jax.drafters.dflash`), and what the rest of the code asks of a kind it finds in the
kind's one `register(DrafterKind(...))` entry."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

from specblock_jax.drafters import registry

ROOT = Path(__file__).resolve().parents[1]
DRAFTERS = ROOT / "specblock_jax" / "drafters"
SHIPPED = sorted(m.name for m in pkgutil.iter_modules([str(DRAFTERS)]) if m.ispkg)

# (file, kind) pairs allowed to name the kind, each with its reason
ALLOWED = {
    # BlockPilot drives a DFlash drafter (its folder points at one; it routes DFlash block sizes)
    **{(str(p.relative_to(ROOT)), "dflash"): "BlockPilot is built on DFlash"
       for p in (DRAFTERS / "blockpilot").rglob("*.py")},
}
# literals allowed by value in one file: the name of our own folder format, which is the project's
# name (`hf_format.NATIVE`: "specblock", every kind's format and our config.json entry in the others)
ALLOWED_CONSTANTS = {("specblock_jax/drafters/hf_format.py", "NATIVE")}
PENDING: set = set()  # (file, kind) literals still to be moved behind the registry: none


def _docstrings(tree: ast.AST) -> set[int]:
    nodes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, nodes) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def _named_constants(tree: ast.AST, names: set[str]) -> set[int]:
    """The string literals assigned to the module-level names `names`."""
    return {id(n.value) for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
            and any(isinstance(t, ast.Name) and t.id in names for t in n.targets)}


def kind_literals(path: Path, root: Path, kinds: list[str]) -> list[tuple[str, str, int]]:
    """(file, kind, line) of each string literal in `path` (docstrings aside) naming one of `kinds`
    as a word (not inside a longer name, a flag such as "--dflash" or "specblock-train"), unless
    the file is in that kind's own package."""
    rel = str(path.relative_to(root))
    parts = path.relative_to(root).parts
    own = parts[2] if parts[:2] == ("specblock_jax", "drafters") and len(parts) > 3 else None
    word = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, kinds)) + r")(?![\w-])")
    tree = ast.parse(path.read_text())
    skip = _docstrings(tree) | _named_constants(tree, {n for f, n in ALLOWED_CONSTANTS if f == rel})
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            found += [(rel, m.group(1), node.lineno) for m in word.finditer(node.value) if m.group(1) != own]
    return found


def _words(identifier: str) -> list[str]:
    """An identifier's lowercase words: `BlockPilotDrafter` -> block, pilot, drafter;
    `eagle3_objective` -> eagle3, objective (digits stay with their word)."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", identifier)
    return [w for w in spaced.lower().split("_") if w]


def _names_kind(identifier: str, kind: str) -> bool:
    """Whether the identifier's words, run together, contain the kind's name without underscores
    (`PromptLookup`, `blockpilot_policy`, `load_eagle3`); the project's own package names
    (`specblock_jax`, `specblock_jax_cli`) aside."""
    words = _words(identifier)
    return words[:2] != ["specblock", "jax"] and kind.replace("_", "") in "".join(words)


def kind_identifiers(path: Path, root: Path, kinds: list[str]) -> list[tuple[str, str, int, str]]:
    """(file, kind, line, what) of each identifier or import path in `path` that names one of
    `kinds`, unless the file is in that kind's own package."""
    rel = str(path.relative_to(root))
    parts = path.relative_to(root).parts
    own = parts[2] if parts[:2] == ("specblock_jax", "drafters") and len(parts) > 3 else None
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.alias):
            names = [node.asname or node.name.split(".")[-1]]
        elif isinstance(node, ast.ImportFrom) and node.module:
            mod = node.module.split(".")
            if mod[:2] == ["specblock_jax", "drafters"] and len(mod) > 2 and mod[2] in kinds and mod[2] != own:
                found.append((rel, mod[2], node.lineno, node.module))
        if isinstance(node, ast.Import):
            for alias in node.names:
                mod = alias.name.split(".")
                if mod[:2] == ["specblock_jax", "drafters"] and len(mod) > 2 and mod[2] in kinds and mod[2] != own:
                    found.append((rel, mod[2], node.lineno, alias.name))
        for name in names:
            found += [(rel, k, getattr(node, "lineno", 0), name) for k in kinds if k != own and _names_kind(name, k)]
    return found


def _code_files() -> list[Path]:
    return sorted((ROOT / "specblock_jax").rglob("*.py")) + sorted((ROOT / "infer").glob("*.py")) \
        + sorted((ROOT / "train").glob("*.py"))


def test_no_kind_is_named_outside_its_package():
    found = [f for p in _code_files() for f in kind_literals(p, ROOT, SHIPPED)]
    unexpected = sorted(f for f in found if f[:2] not in ALLOWED and f[:2] not in PENDING)
    assert unexpected == [], "name the kind through the registry (drafters/registry.py) instead"
    assert {f[:2] for f in found} >= PENDING, "a pending file no longer names the kind: drop its PENDING entry"


def test_no_kind_is_named_by_an_identifier_or_import_outside_its_package():
    found = [f for p in _code_files() for f in kind_identifiers(p, ROOT, SHIPPED)]
    unexpected = sorted(f for f in found if f[:2] not in ALLOWED)
    assert unexpected == [], "reach the kind through the registry (drafters/registry.py) instead"


def test_the_identifier_check_catches_names_and_imports_and_nothing_else(tmp_path):
    src = tmp_path / "infer" / "x.py"
    src.parent.mkdir(parents=True)
    src.write_text("import specblock_jax\nfrom specblock_jax.drafters.dflash import KIND\n"
                   "from specblock_jax.drafters import registry\n"
                   "def load_eagle3(x):\n    return x.PromptLookup\n"
                   "class SpecblockJaxThing:\n    pass\nspecblock_jax.decoding\nblocks = 1\n")
    kinds = ["eagle3", "dflash", "prompt_lookup", "specblock"]
    got = sorted((k, line) for _, k, line, _ in kind_identifiers(src, tmp_path, kinds))
    assert got == [("dflash", 2), ("eagle3", 4), ("prompt_lookup", 5)]
    own = tmp_path / "specblock_jax" / "drafters" / "dflash" / "_y.py"
    own.parent.mkdir(parents=True)
    own.write_text("from specblock_jax.drafters.dflash._model import DFlashDrafter\n")
    assert kind_identifiers(own, tmp_path, kinds) == []


def test_the_literal_check_catches_a_kind_name_and_nothing_else(tmp_path):
    src = tmp_path / "specblock_jax" / "drafters" / "eagle3" / "_x.py"
    src.parent.mkdir(parents=True)
    src.write_text('"""The eagle3 kind."""\nA = "eagle3"\nB = "--dflash"\nC = "specblock-train"\n'
                   'D = f"use {A} or dflash"\nE = "eagle3_v2"\n')
    other = tmp_path / "infer" / "x.py"
    other.parent.mkdir()
    other.write_text(src.read_text())
    kinds = ["eagle3", "dflash", "specblock"]
    assert kind_literals(src, tmp_path, kinds) == [("specblock_jax/drafters/eagle3/_x.py", "dflash", 5)]
    assert kind_literals(other, tmp_path, kinds) == [("infer/x.py", "eagle3", 2), ("infer/x.py", "dflash", 5)]


def test_every_shipped_kind_registers_itself_under_its_package_name():
    assert set(SHIPPED) <= set(registry.kinds())
    for name in SHIPPED:
        module = importlib.import_module(f"{registry.PACKAGE}.{name}")
        assert module.KIND is registry.get(name) and module.KIND.name == name
        assert all(f.kind == name for f in module.KIND.formats)


def test_trainable_kinds_are_exactly_those_with_a_task():
    assert registry.kinds(trainable=True) == sorted(k for k in registry.kinds() if registry.get(k).task is not None)
    assert set(registry.kinds(trainable=True)) >= {k for k in SHIPPED if registry.get(k).task is not None}


def test_every_released_format_and_converter_is_reached_through_its_kind(capsys):
    from specblock_jax.drafters import hf_format
    from specblock_jax_cli.train import convert

    formats = registry.released_formats()
    assert set(hf_format.formats()) == {hf_format.NATIVE, *formats}
    for name, fmt in formats.items():
        assert fmt in registry.get(fmt.kind).formats and name in hf_format.formats_of(fmt.kind)
    with pytest.raises(SystemExit) as exit_info:
        convert.main(["--help"])
    converters = [k for k in registry.kinds() if registry.get(k).convert is not None]
    assert exit_info.value.code == 0 and "{" + ",".join(converters) + "}" in capsys.readouterr().out


def test_a_format_that_holds_another_kinds_drafters_is_refused():
    fmt = registry.ReleasedFormat("toy_layout", "another_kind", lambda hf: False, None, None, None)
    with pytest.raises(ValueError, match="its format 'toy_layout' holds 'another_kind' drafters"):
        registry.register(registry.DrafterKind("toy_kind", load=lambda *a: None, formats=(fmt,)))
    assert "toy_kind" not in registry.kinds()
