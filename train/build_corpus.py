"""Build the offline text corpus from the running interpreter's CPython standard library and,
optionally, the installed Python packages a distribution depends on at run time.

Every ``*.py`` file under ``sysconfig.get_paths()["stdlib"]`` (recursively, ``site-packages`` and
``dist-packages`` excluded) becomes one record ``{"path": <posix relpath>, "text": <file text>}`` in
one of three JSONL splits: ``train.jsonl``, ``validation.jsonl`` and ``heldout.jsonl``. With
``--packages-of specblock-jax`` the ``*.py`` files of every installed distribution in the run-time
dependency closure of that distribution (extras excluded, so no test-only package such as torch;
the distribution itself excluded) are added as ``packages/<path under site-packages>``, a
deterministic ``--package-share`` percent of them (by a salted hash of the path); the manifest lists
each distribution with its version. Package files of the train bucket join ``train.jsonl``; those
of the validation and held-out buckets go to ``validation_packages.jsonl`` / ``heldout_packages.jsonl``,
so ``validation.jsonl`` and ``heldout.jsonl`` stay the standard library's (comparable across
corpora). Stdlib paths, and so their splits, are unchanged.

Split rule (deterministic, independent of the file set and of the machine)::

    bucket = int(sha256(relpath.encode("utf-8")).hexdigest(), 16) % 100
    bucket <  90  -> train
    bucket <  95  -> validation
    otherwise     -> heldout

Files inside a test directory (any path component ``test``, ``tests`` or ``idle_test``) are never
held out: when their bucket says ``heldout`` they go to **train** instead. Held-out files are used
for benchmark prompts, and test code (fixtures, odd encodings, huge generated tables) is a poor
stand-in for "unseen ordinary source".

Files are skipped (logged with a reason and recorded in the manifest, never a crash) when they are
unreadable, empty or whitespace-only, larger than ``max_bytes``, or not valid UTF-8.

Usage::

    python -m train.build_corpus --out data/corpus
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import platform
import sys
import sysconfig
from collections import Counter
from pathlib import Path
from typing import Any

from tqdm import tqdm

log = logging.getLogger(__name__)

SPLITS: tuple[str, ...] = ("train", "validation", "heldout")  # the standard library's splits
PACKAGE_SPLITS: tuple[str, ...] = ("validation_packages", "heldout_packages")
ALL_SPLITS = SPLITS + PACKAGE_SPLITS
PACKAGE_PREFIX = "packages/"
# Never corpus text: the test extra's packages (and torch's own closure, should a run-time
# dependency ever pull it in).
TEST_ONLY_DISTRIBUTIONS: frozenset[str] = frozenset({"torch", "pytest", "hypothesis", "triton"})
TEST_DIR_NAMES: frozenset[str] = frozenset({"test", "tests", "idle_test"})
EXCLUDED_DIR_NAMES: frozenset[str] = frozenset({"site-packages", "dist-packages", "__pycache__"})
DEFAULT_MAX_BYTES = 1_000_000
# The copy of the manifest under assets/ drops per-file hashes when it would exceed this size.
ASSET_MANIFEST_MAX_BYTES = 300_000
SPLIT_RULE = (
    "bucket = int(sha256(posix_relpath.encode('utf-8')).hexdigest(), 16) % 100; "
    "bucket < 90: train, < 95: validation, else heldout; files under a 'test', 'tests' or "
    "'idle_test' directory whose bucket says heldout go to train"
)


def is_test_path(relpath: str) -> bool:
    """True when any directory component of the posix ``relpath`` is a test directory."""
    return any(part in TEST_DIR_NAMES for part in relpath.split("/")[:-1])


def bucket_of(relpath: str) -> int:
    """The hash bucket (0..99) of a posix path relative to the corpus root."""
    return int(hashlib.sha256(relpath.encode("utf-8")).hexdigest(), 16) % 100


def split_of(relpath: str) -> str:
    """The split of a posix path relative to the root: ``train``, ``validation`` or ``heldout``
    (``validation_packages`` / ``heldout_packages`` for a ``packages/`` path).

    Depends only on the path string, so adding or removing other files never moves a file.
    """
    bucket = bucket_of(relpath)
    if bucket < 90:
        return "train"
    split = "validation" if bucket < 95 else "train" if is_test_path(relpath) else "heldout"
    return split + "_packages" if relpath.startswith(PACKAGE_PREFIX) and split != "train" else split


def in_package_share(relpath: str, share: int) -> bool:
    """Whether a package path is among the `share` percent kept (a hash independent of the split's)."""
    return int(hashlib.sha256(b"share:" + relpath.encode("utf-8")).hexdigest(), 16) % 100 < share


def default_stdlib_root() -> Path:
    """The standard library directory of the running interpreter."""
    return Path(sysconfig.get_paths()["stdlib"])


def iter_source_files(root: Path) -> list[str]:
    """Sorted posix relpaths of all ``*.py`` files under ``root``, excluded directories pruned."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIR_NAMES)
        for name in filenames:
            if name.endswith(".py"):
                found.append(Path(dirpath, name).relative_to(root).as_posix())
    return sorted(found)


def _normalize(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def runtime_distributions(root_dist: str) -> dict[str, str]:
    """{normalized name: version} of the installed distributions that `root_dist` needs at run
    time, recursively (requirements behind an extra or a false marker are not followed; missing
    optional ones are skipped), `root_dist` itself excluded. Raises ValueError if a test-only
    distribution is reached."""
    from importlib import metadata

    from packaging.requirements import Requirement

    seen: dict[str, str] = {}
    todo = [_normalize(root_dist)]
    while todo:
        name = todo.pop()
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            if name == _normalize(root_dist):
                raise ValueError(f"distribution {root_dist!r} is not installed") from None
            continue
        if name != _normalize(root_dist):
            seen[name] = dist.version
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            dep = _normalize(req.name)
            if dep in TEST_ONLY_DISTRIBUTIONS:
                raise ValueError(f"{name} requires the test-only distribution {dep}")
            if dep not in seen and dep not in todo and dep != _normalize(root_dist):
                todo.append(dep)
    return dict(sorted(seen.items()))


def package_sources(distributions: dict[str, str], share: int = 100) -> dict[str, Path]:
    """{"packages/<path under site-packages>": file} for the ``*.py`` files the distributions
    installed (their RECORD) that are `in_package_share`, sorted."""
    from importlib import metadata

    found: dict[str, Path] = {}
    for name in distributions:
        dist = metadata.distribution(name)
        for f in dist.files or []:
            rel = PACKAGE_PREFIX + f.as_posix()
            if (f.suffix == ".py" and ".." not in f.parts and "__pycache__" not in f.parts
                    and in_package_share(rel, share)):
                found[rel] = Path(dist.locate_file(f))
    return dict(sorted(found.items()))


def read_source(path: Path, max_bytes: int) -> tuple[str | None, str, str]:
    """Read one file; return ``(text, reason_code, detail)`` where ``text`` is None when skipped."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            return None, "too_large", f"{size} bytes > {max_bytes}"
        data = path.read_bytes()
    except OSError as exc:
        return None, "unreadable", f"{type(exc).__name__}: {exc}"
    if len(data) > max_bytes:
        return None, "too_large", f"{len(data)} bytes > {max_bytes}"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, "not_utf8", f"invalid UTF-8 at byte {exc.start}"
    if not text.strip():
        return None, "empty", "empty or whitespace-only"
    return text, "", ""


def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def compact_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest without per-file hashes and sizes (only relpaths per split)."""
    small = {k: v for k, v in manifest.items() if k != "splits"}
    small["splits"] = {
        name: {**{k: v for k, v in info.items() if k != "entries"},
               "paths": [e["path"] for e in info["entries"]]}
        for name, info in manifest["splits"].items()
    }
    small["per_file_hashes_dropped"] = True
    return small


def write_manifest_copy(manifest: dict[str, Any], path: Path,
                        max_bytes: int = ASSET_MANIFEST_MAX_BYTES) -> None:
    """Write ``manifest`` to ``path``; drop per-file hashes if the result would exceed max_bytes."""
    _write_json(path, manifest)
    if path.stat().st_size > max_bytes:
        log.info("manifest copy %s is %d bytes > %d: dropping per-file hashes",
                 path, path.stat().st_size, max_bytes)
        _write_json(path, compact_manifest(manifest))


def build_corpus(out_dir: str | Path, root: str | Path | None = None,
                 max_bytes: int = DEFAULT_MAX_BYTES,
                 manifest_copy: str | Path | None = None,
                 progress: bool = True, packages_of: str | None = None,
                 package_share: int = 100) -> dict[str, Any]:
    """Build the three JSONL splits and ``manifest.json`` in ``out_dir``; return the manifest.

    Args:
      out_dir: output directory (created).
      root: source tree; the running interpreter's stdlib by default.
      max_bytes: files larger than this are skipped.
      manifest_copy: optional second path for the manifest (e.g. ``assets/corpus_manifest.json``),
        written without per-file hashes if it would be larger than 300 KB.
      progress: show a tqdm progress bar.
      packages_of: also add the sources of this distribution's run-time dependencies
        (`runtime_distributions`), as ``packages/...`` paths, `package_share` percent of them.
    """
    root = Path(root) if root is not None else default_stdlib_root()
    if not root.is_dir():
        raise FileNotFoundError(f"corpus root {root} is not a directory")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sources = {rel: root / rel for rel in iter_source_files(root)}
    distributions = runtime_distributions(packages_of) if packages_of else {}
    sources.update(package_sources(distributions, package_share))
    relpaths = list(sources)
    entries: dict[str, list[dict[str, Any]]] = {s: [] for s in ALL_SPLITS}
    skipped: list[dict[str, str]] = []
    handles = {s: open(out / f"{s}.jsonl", "w", encoding="utf-8") for s in ALL_SPLITS}
    try:
        for rel in tqdm(relpaths, desc="corpus files", unit="file", disable=not progress):
            text, reason, detail = read_source(sources[rel], max_bytes)
            if text is None:
                log.info("skipped %s: %s (%s)", rel, reason, detail)
                skipped.append({"path": rel, "reason": reason, "detail": detail})
                continue
            data = text.encode("utf-8")
            split = split_of(rel)
            handles[split].write(json.dumps({"path": rel, "text": text}, ensure_ascii=False) + "\n")
            entries[split].append({"path": rel, "bytes": len(data),
                                   "sha256": hashlib.sha256(data).hexdigest()})
    finally:
        for h in handles.values():
            h.close()
    reasons = Counter(s["reason"] for s in skipped)
    for reason, n in sorted(reasons.items()):
        log.warning("skipped %d file(s): %s", n, reason)
    manifest: dict[str, Any] = {
        "python_version": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "sys_version": sys.version,
        "stdlib_root": str(root),
        "packages_of": packages_of,
        "package_share": package_share if packages_of else None,
        "distributions": distributions,
        "max_file_bytes": max_bytes,
        "split_rule": SPLIT_RULE,
        "files_seen": len(relpaths),
        "splits": {
            s: {"file": f"{s}.jsonl", "files": len(entries[s]),
                "bytes": sum(e["bytes"] for e in entries[s]), "entries": entries[s]}
            for s in ALL_SPLITS
        },
        "skipped_counts": dict(sorted(reasons.items())),
        "skipped": skipped,
    }
    _write_json(out / "manifest.json", manifest)
    if manifest_copy is not None:
        write_manifest_copy(manifest, Path(manifest_copy))
    for s in ALL_SPLITS:
        info = manifest["splits"][s]
        log.info("%-10s %5d files %10d bytes", s, info["files"], info["bytes"])
    return manifest


def read_split(corpus_dir: str | Path, split: str) -> list[dict[str, str]]:
    """Read the records ``{"path", "text"}`` of one split written by :func:`build_corpus`."""
    if split not in ALL_SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {ALL_SPLITS}")
    path = Path(corpus_dir) / f"{split}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; run `python -m train.build_corpus` first")
    records = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            try:
                rec = json.loads(line)
                records.append({"path": rec["path"], "text": rec["text"]})
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: bad corpus record ({exc})") from exc
    return records


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="data/corpus", help="output directory")
    parser.add_argument("--root", default=None, help="source tree (default: this Python's stdlib)")
    parser.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES,
                        help="skip files larger than this")
    parser.add_argument("--manifest-copy", default="assets/corpus_manifest.json",
                        help="second copy of the manifest ('' for none)")
    parser.add_argument("--packages-of", default=None,
                        help="also add the sources of this distribution's run-time dependencies "
                             "(e.g. specblock-jax)")
    parser.add_argument("--package-share", type=int, default=100,
                        help="percent of the package files kept (deterministic by path hash)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar, warnings only")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    build_corpus(args.out, root=args.root, max_bytes=args.max_bytes,
                 manifest_copy=args.manifest_copy or None, progress=not args.quiet,
                 packages_of=args.packages_of, package_share=args.package_share)


if __name__ == "__main__":
    main()
