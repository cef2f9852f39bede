"""Packaging: the command-line folders train/ and infer/ install as specblock_jax_cli.train and
specblock_jax_cli.infer (never as top-level `train` / `infer`, which would collide with a user's
own modules), nothing in the library imports them, and they import each other's modules relatively
and never across (infer/ and train/ share code through the library only)."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = {"specblock_jax_cli.infer": "infer", "specblock_jax_cli.train": "train"}


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _imports(path: Path) -> set[str]:
    """Top-level names of a file's absolute imports, lazy ones included, and ".." for a relative
    import that leaves the file's own folder."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module.split(".")[0] if node.level == 0 else ".." if node.level > 1 else ".")
    return names


def test_every_library_package_and_the_cli_packages_are_installed_under_their_names():
    library = sorted(".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "specblock_jax").rglob("__init__.py"))
    cfg = _setuptools()
    assert sorted(cfg["packages"]) == sorted(library + list(CLI))
    assert cfg["package-dir"] == CLI
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for name, entry in scripts.items():
        module = entry.split(":")[0]
        package, _, file = module.rpartition(".")
        assert package in CLI and (ROOT / CLI[package] / f"{file}.py").is_file(), f"{name} = {entry}"


def test_the_cli_packages_import_from_anywhere_and_train_and_infer_do_not(tmp_path):
    code = ("import importlib.util as u; "
            "print([u.find_spec(m) is not None for m in ('specblock_jax_cli.train.cli', "
            "'specblock_jax_cli.infer.decode', 'train', 'infer')])")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[True, True, False, False]", out.stderr


def test_the_library_never_imports_the_cli_and_the_cli_folders_import_each_other_only_relatively():
    cli_names = {"train", "infer", "specblock_jax_cli", ".."}
    library = {str(p.relative_to(ROOT)): _imports(p) & cli_names for p in (ROOT / "specblock_jax").rglob("*.py")}
    assert {f: bad for f, bad in library.items() if bad} == {}
    cli = {str(p.relative_to(ROOT)): _imports(p) & cli_names
           for folder in CLI.values() for p in (ROOT / folder).glob("*.py")}
    assert {f: bad for f, bad in cli.items() if bad} == {}
