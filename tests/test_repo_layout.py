"""Repository layout: every tracked path checks out on Windows, and docs/ and benchmarks/ stay small.

Benchmark runs once committed completion files named after methods such as `dflash:block_size=4`;
a ':' (or any of `*?"<>|\\`) in a path cannot be checked out on Windows. docs/ holds guides and
benchmarks/ one folder per study (its script, results.md, a compact results.json, cited plots):
no completion files (`outputs_*`: greedy identity is a count the bench recomputes and the tests
prove), and the two together at most 3 MB.
"""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = set(':*?"<>|\\')
MAX_DOCS_FILE_BYTES = 1_000_000
MAX_DOCS_AND_BENCHMARKS_BYTES = 3_000_000
SMALL_DIRS = ("docs/", "benchmarks/")


def _tracked_paths() -> list[str]:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    proc = subprocess.run(
        ["git", "-c", "core.quotePath=false", "ls-files", "-z"],
        cwd=ROOT, capture_output=True, timeout=60,
    )
    if proc.returncode != 0:
        pytest.skip(f"{ROOT} is not a git checkout: {proc.stderr.decode(errors='replace').strip()}")
    return [p for p in proc.stdout.decode("utf-8", errors="surrogateescape").split("\0") if p]


def test_tracked_paths_are_portable_and_docs_files_small():
    paths = _tracked_paths()
    assert paths, "git ls-files returned no paths"

    bad_names = [p for p in paths if FORBIDDEN & set(p)]
    assert not bad_names, f"tracked paths with one of {''.join(sorted(FORBIDDEN))}: {bad_names}"

    large = []
    for p in paths:
        if not p.startswith(SMALL_DIRS):
            continue
        f = ROOT / p
        if f.is_file() and f.stat().st_size > MAX_DOCS_FILE_BYTES:  # deleted, not yet staged: skip
            large.append(f"{p} ({f.stat().st_size} bytes)")
    assert not large, f"tracked files under docs/ or benchmarks/ larger than 1 MB: {large}"


def test_docs_and_benchmarks_hold_no_completions_and_at_most_3_mb():
    paths = [p for p in _tracked_paths() if p.startswith(SMALL_DIRS)]
    assert paths, "nothing tracked under docs/ or benchmarks/"
    completions = [p for p in paths if Path(p).name.startswith("outputs_")]
    assert not completions, f"completion files tracked under docs/ or benchmarks/: {completions}"
    sizes = [(ROOT / p).stat().st_size for p in paths if (ROOT / p).is_file()]  # deleted, not staged: skip
    assert sum(sizes) <= MAX_DOCS_AND_BENCHMARKS_BYTES, (
        f"docs/ and benchmarks/ hold {sum(sizes):,} bytes in {len(sizes)} tracked files (at most 3 MB)")
