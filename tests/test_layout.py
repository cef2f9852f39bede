"""The package's shape: no import cycles, imports follow the layer order drawn in
docs/architecture.md, no private names imported across modules, and a new drafter kind is one folder
with one `register(...)` call, registered by one import line."""

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


ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def _doc_block(tag: str) -> str:
    """The fenced block of docs/architecture.md whose info string is `tag`."""
    text = ARCHITECTURE.read_text()
    start = text.index(f"```{tag}\n") + len(tag) + 4
    return text[start:text.index("```", start)]


def _layers() -> list[set[str]]:
    """The layer order drawn in docs/architecture.md: subpackages (or top modules) low to high."""
    return [{name.strip() for name in group.split(",")} for group in _doc_block("layers").split("->")]


# Modules allowed to import above their layer, each with its reason (a stale entry fails the test).
ABOVE_THEIR_LAYER = {
    "specblock_jax.drafters.blockpilot._command":
        "BlockPilot's training command (registry.train_command, run by specblock-train) decodes "
        "labels, profiles steps and runs the trainer: the top of the stack, kept in its kind's "
        "folder so no other code names the kind; its imports run when the command does, never on "
        "import of the package",
}


def test_imports_follow_the_layer_order_drawn_in_the_architecture_doc():
    layers = _layers()
    rank = {name: i for i, group in enumerate(layers) for name in group}
    tops = {m.split(".")[1] for m in _graph() if m.count(".") >= 1}
    assert tops == set(rank), f"subpackages not in the drawn order: {sorted(tops ^ set(rank))}"
    against, excused = [], set()
    for module, deps in _graph().items():
        if module == "specblock_jax":
            continue
        if module in ABOVE_THEIR_LAYER:
            excused.add(module)
            continue
        src = module.split(".")[1]
        for dep, _ in deps:
            dst = dep.split(".")[1] if dep.count(".") >= 1 else None
            if dst is None:
                against.append(f"{module} imports the package root")
            elif dst != src and rank[dst] > rank[src]:
                against.append(f"{module} ({src}) imports {dep} ({dst}, a higher layer)")
    assert against == []
    assert excused == set(ABOVE_THEIR_LAYER), "an exception names a module that no longer exists"
    for module in ABOVE_THEIR_LAYER:  # and still needs it: it imports above its layer
        src = module.split(".")[1]
        assert any(dep.count(".") == 0 or rank[dep.split(".")[1]] > rank[src] for dep, _ in _graph()[module]), module


def test_the_layer_check_catches_an_upward_import(monkeypatch):
    graph = _graph()
    graph["specblock_jax.models.target"] = graph["specblock_jax.models.target"] + [("specblock_jax.serving.auto", [])]
    monkeypatch.setattr(sys.modules[__name__], "_graph", lambda: graph)
    with pytest.raises(AssertionError, match="models.target .models. imports specblock_jax.serving.auto"):
        test_imports_follow_the_layer_order_drawn_in_the_architecture_doc()


def test_shared_drafter_modules_import_no_kind_package():
    kinds = {m for m in _graph() if m.count(".") == 2 and m.startswith("specblock_jax.drafters.")
             and (PACKAGE / "drafters" / m.split(".")[2]).is_dir()}
    shared = [m for m in _graph() if m.startswith("specblock_jax.drafters.") and m.count(".") == 2 and m not in kinds]
    bad = [(m, dep) for m in shared for dep, _ in _graph()[m] if any(dep == k or dep.startswith(k + ".") for k in kinds)]
    assert kinds >= {f"specblock_jax.drafters.{k}" for k in ("eagle3", "specblock", "dflash", "blockpilot")}
    assert bad == []


def test_a_new_drafter_kind_is_one_folder_and_one_import_line(tmp_path, monkeypatch):
    """The toy kind of docs/architecture.md ("Adding a drafter kind"), written as a folder and
    registered by one import line, saves, loads and decodes token-identically; auto serving varies
    its budget knob."""
    from helpers import peaked_tiny_target

    (tmp_path / "toy_bigram").mkdir()
    (tmp_path / "toy_bigram" / "__init__.py").write_text(_doc_block("python toy_bigram/__init__.py"))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import toy_bigram  # the one import line

        target = peaked_tiny_target(24)
        # a bigram table that agrees with the target's greedy next token for a few contexts
        table = np.asarray(np.random.default_rng(0).normal(size=(24, 24)), np.float32)
        drafter = toy_bigram.ToyDrafter(toy_bigram.ToyConfig(24), num_nodes=5)
        sbj.save_drafter(drafter, {"table": table}, tmp_path / "toy", dtype="float32")
        loaded = sbj.load_drafter(tmp_path / "toy", target, num_nodes=3)
        assert isinstance(loaded.drafter, toy_bigram.ToyDrafter) and loaded.drafter.num_nodes == 3
        np.testing.assert_array_equal(np.asarray(loaded.params["table"]), table)
        prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
        options = sbj.DecodeOptions(batch_size=2)
        ar = sbj.generate(target, prompts, max_new_tokens=12, options=options)
        spec = sbj.generate(target, prompts, loaded, max_new_tokens=12, options=options)
        assert [s.token_ids for s in spec] == [a.token_ids for a in ar]
        assert all(s.stats.target_forwards >= 1 for s in spec)
        assert sbj.serving.AutoServe(loaded, budgets=(2,)).options == ["ar", 2, 3]
        assert "toy_bigram" in sbj.drafters.registry.kinds()
    finally:
        from specblock_jax.drafters import registry

        sys.modules.pop("toy_bigram", None)
        registry.unregister("toy_bigram")


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
