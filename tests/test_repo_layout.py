"""Repository layout: every tracked path checks out on Windows, and docs/ holds no large files.

Benchmark runs under docs/bench/ once committed completion files named after methods such as
`dflash:block_size=4`; a ':' (or any of `*?"<>|\\`) in a path cannot be checked out on Windows.
Completions that a doc cites are kept gzip-compressed; large raw outputs belong outside docs/.
"""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = set(':*?"<>|\\')
MAX_DOCS_FILE_BYTES = 1_000_000


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
        if not p.startswith("docs/"):
            continue
        f = ROOT / p
        if f.is_file() and f.stat().st_size > MAX_DOCS_FILE_BYTES:  # deleted, not yet staged: skip
            large.append(f"{p} ({f.stat().st_size} bytes)")
    assert not large, f"tracked files under docs/ larger than 1 MB: {large}"
