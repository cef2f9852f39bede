"""Rules every writer of a model folder follows (`save_drafter`, `save_target`, `specblock-export`,
the trainer's export):

- Shipped folders are read-only: a folder under the package's `assets/` (the checkout's, the same
  folder the CLIs find the embedded default target in: `ASSETS`), or under any checkout's
  `assets/` (an `assets` folder beside a `specblock_jax` package folder), is refused unless the
  caller says `overwrite` (`check_writable`, `ShippedFolderError` naming the folder). Paths are
  resolved first, so `./x/../assets/target` or a symlink into assets/ is caught too.
- Files get the user's umask: safetensors' writer creates its files 0600 whatever the umask;
  `follow_umask` gives them the mode `open()` would have (0644 under umask 022), as the configs
  already have.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from pathlib import Path
from typing import Iterator

ASSETS = Path(__file__).resolve().parents[1] / "assets"  # the checkout's shipped models and data

_REPLACING: contextvars.ContextVar[frozenset[Path]] = contextvars.ContextVar("replacing", default=frozenset())


class ShippedFolderError(ValueError):
    """A writer was pointed at a shipped folder without overwrite (`check_writable`)."""


def shipped(path: str | os.PathLike) -> bool:
    """Whether `path` (resolved) is the package's assets/ folder or lies under it, or under any
    checkout's assets/ (a folder named assets beside a specblock_jax package folder)."""
    p = Path(path).resolve()
    if p == ASSETS or ASSETS in p.parents:
        return True
    return any(q.name == "assets" and (q.parent / "specblock_jax").is_dir() for q in (p, *p.parents))


def check_writable(path: str | os.PathLike, overwrite: bool = False, flag: str = "overwrite=True") -> None:
    """ShippedFolderError naming `path` when it is shipped (`shipped`) and neither `overwrite` nor
    an enclosing `replacing(path)` allows it. flag: how the caller's user says overwrite (the
    CLI's "--overwrite", the trainer's "overwrite=true"), named in the error."""
    if overwrite or not shipped(path) or Path(path).resolve() in _REPLACING.get():
        return
    raise ShippedFolderError(f"{path}: is a shipped folder (under {ASSETS}); write elsewhere, or pass "
                             f"{flag} to replace it")


@contextlib.contextmanager
def replacing(path: str | os.PathLike) -> Iterator[None]:
    """Within it, writers may replace `path` though it is shipped: for a caller that has already
    checked and been told to overwrite (the trainer's `overwrite=true`, whose task's export calls
    `save_drafter` / `save_target` without an overwrite argument)."""
    token = _REPLACING.set(_REPLACING.get() | {Path(path).resolve()})
    try:
        yield
    finally:
        _REPLACING.reset(token)


def umask() -> int:
    """The process's umask (read from /proc where it can be, else set and restored)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(folder: str | os.PathLike, pattern: str = "*.safetensors") -> None:
    """Gives the files `pattern` matches in `folder` the mode a plain `open()` would have:
    0666 less the umask (safetensors writes 0600)."""
    mode = 0o666 & ~umask()
    for file in Path(folder).glob(pattern):
        if file.is_file():
            os.chmod(file, mode)
