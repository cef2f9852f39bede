"""The package's shape: no import cycles, no private names imported across modules, and a new
drafter kind is one module with one `register(...)` call."""

from __future__ import annotations

import ast
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import specblock_jax as sbj

PACKAGE = Path(sbj.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> list[tuple[str, list[str]]]:
    """(imported package module, names imported from it) of every import in the file, lazy ones
    included; `from pkg import sub` counts as an import of the submodule pkg.sub."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name in modules]
        elif isinstance(node, ast.ImportFrom) and node.module in modules:
            subs = [a.name for a in node.names if f"{node.module}.{a.name}" in modules]
            found += [(f"{node.module}.{s}", []) for s in subs]
            rest = [a.name for a in node.names if a.name not in subs]
            if rest:
                found.append((node.module, rest))
    return found


def _graph() -> dict[str, list[tuple[str, list[str]]]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {m: _imports(p, set(files)) for m, p in files.items()}


def test_the_package_import_graph_has_no_cycle():
    graph = {m: sorted({dep for dep, _ in deps}) for m, deps in _graph().items()}
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for dep in graph[m]:
            assert state.get(dep) != 1, "import cycle: " + " -> ".join(path[path.index(dep):] + [m, dep])
            if dep not in state:
                visit(dep, path + [m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    assert len(graph) > 40  # the walk saw the whole package


def test_no_private_name_is_imported_across_modules():
    private = [(m, dep, n) for m, deps in _graph().items() for dep, names in deps for n in names
               if n.startswith("_") and not n.startswith("__")]
    assert private == []


TOY_MODULE = '''
"""A toy drafter kind: drafts a chain by following a bigram table (argmax of its row)."""
import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from specblock_jax.drafters.io import load_weights
from specblock_jax.drafters.registry import DrafterKind, register
from specblock_jax.trees import DraftTree, chain_parents


@dataclasses.dataclass(frozen=True)
class ToyConfig:
    vocab_size: int


@dataclasses.dataclass(frozen=True)
class ToyDrafter:
    kind: ClassVar[str] = "toy_bigram"
    config: ToyConfig
    num_nodes: int = 4
    max_children = 1
    hidden_ids = ()
    forwards_per_step = 0

    def init_state(self, params, prefill, max_len):
        return ()

    def propose(self, params, state, ctx, key):
        tokens = [ctx.root]
        for _ in range(self.num_nodes - 1):
            tokens.append(jnp.argmax(params["table"][tokens[-1]], axis=-1).astype(jnp.int32))
        b = ctx.root.shape[0]
        tree = DraftTree(jnp.stack(tokens, 1), chain_parents(b, self.num_nodes),
                         jnp.ones((b, self.num_nodes), bool))
        return tree, state

    def update(self, params, state, ctx, result, hidden):
        return state


def load_toy(path, meta, target, dtype, decoding):
    config = ToyConfig(**meta["config"])
    template = {"table": jax.ShapeDtypeStruct((config.vocab_size, config.vocab_size), jnp.float32)}
    return ToyDrafter(config, **{**meta["decoding"], **decoding}), load_weights(path, template, "float32")


register(DrafterKind("toy_bigram", load=load_toy))
'''


def test_a_new_drafter_kind_is_one_module_and_one_register_call(tmp_path, monkeypatch):
    from helpers import peaked_tiny_target

    (tmp_path / "toy_bigram_kind.py").write_text(textwrap.dedent(TOY_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    toy = __import__("toy_bigram_kind")
    try:
        target = peaked_tiny_target(24)
        # a bigram table that agrees with the target's greedy next token for a few contexts
        table = np.asarray(np.random.default_rng(0).normal(size=(24, 24)), np.float32)
        drafter = toy.ToyDrafter(toy.ToyConfig(24), num_nodes=5)
        sbj.save_drafter(drafter, {"table": table}, tmp_path / "toy", dtype="float32")
        loaded = sbj.load_drafter(tmp_path / "toy", target, num_nodes=3)
        assert isinstance(loaded[0], toy.ToyDrafter) and loaded[0].num_nodes == 3
        np.testing.assert_array_equal(np.asarray(loaded[1]["table"]), table)
        prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
        ar = sbj.generate(target, prompts, max_new_tokens=12, options=sbj.DecodeOptions(batch_size=2))
        spec = sbj.generate(target, prompts, drafter=loaded, max_new_tokens=12,
                            options=sbj.DecodeOptions(batch_size=2))
        assert [s.token_ids for s in spec] == [a.token_ids for a in ar]
        assert all(s.stats.target_forwards >= 1 for s in spec)
    finally:
        from specblock_jax.drafters import registry

        sys.modules.pop("toy_bigram_kind", None)
        registry._KINDS.pop("toy_bigram", None)


def test_a_drafter_that_breaks_the_tree_contract_gets_a_clear_error():
    import dataclasses

    from helpers import peaked_tiny_target
    from spec_drafters import RandomTreeDrafter

    @dataclasses.dataclass(frozen=True)
    class ShortTree(RandomTreeDrafter):
        def propose(self, params, state, ctx, key):
            tree, state = super().propose(params, state, ctx, key)
            return tree._replace(valid=tree.valid[:, :-1]), state

    target = peaked_tiny_target(24)
    with pytest.raises(ValueError, match=r"ShortTree.propose: DraftTree.valid has shape \(2, 5\), expected \(2, 6\)"):
        sbj.generate(target, [[1, 2], [3]], drafter=sbj.LoadedDrafter(ShortTree(6, 24), ()), max_new_tokens=4,
                     options=sbj.DecodeOptions(batch_size=2))


# --- scripts/ and benchmarks/: user tools and study scripts use the library's public face ---------

ROOT = PACKAGE.parent


def _cli_packages() -> set[str]:
    """The command-line packages (`infer`, `train`, and wherever pyproject installs them): thin
    layers that nothing else imports."""
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    return {"infer", "train"} | {entry.split(":")[0].rsplit(".", 1)[0] for entry in scripts.values()}


def _tool_files() -> list[Path]:
    files = sorted((ROOT / "scripts").glob("*.py")) + sorted((ROOT / "benchmarks").rglob("*.py"))
    assert files, "no scripts found"
    return files


def _tool_problems(path: Path, cli: set[str]) -> list[str]:
    """A tool's imports of private names or of the CLI packages, and any use of sys.path."""
    problems = []
    for node in ast.walk(ast.parse(path.read_text())):
        modules, names = [], []
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules, names = [node.module or ""], [a.name for a in node.names]
        elif (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
              and node.value.id == "sys"):
            problems.append((node.lineno, "sys.path"))
        for m in modules:
            if any(m == c or m.startswith(c + ".") for c in cli):
                problems.append((node.lineno, f"imports the CLI package {m}"))
        private = [n for n in names + [p for m in modules for p in m.split(".")]
                   if n.startswith("_") and not n.startswith("__")]
        problems += [(node.lineno, f"imports the private name {n}") for n in private]
    return [f"line {line}: {what}" for line, what in sorted(problems)]


def test_scripts_and_benchmarks_use_neither_private_names_nor_the_cli_packages_nor_sys_path():
    cli = _cli_packages()
    found = {str(p.relative_to(ROOT)): probs for p in _tool_files() if (probs := _tool_problems(p, cli))}
    assert found == {}


def test_the_tool_check_catches_each_kind_of_problem(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nsys.path.insert(0, '.')\nfrom infer.decode import read_prompts\n"
                   "from specblock_jax.adaptation.adapter import _merge\nimport train.cli\n")
    assert _tool_problems(bad, {"infer", "train"}) == [
        "line 2: sys.path", "line 3: imports the CLI package infer.decode",
        "line 4: imports the private name _merge", "line 5: imports the CLI package train.cli"]
