"""Short names of `specblock-bench` methods, for files, tables' closing lines and plots."""

from __future__ import annotations

from pathlib import Path


def method_label(method: str) -> str:
    """Short name for files and plots: the drafter folder's name (its parent's for an `export`
    folder) with any ':key=value' overrides; "auto-" before an auto: method's."""
    if method.startswith("auto:"):
        return "auto-" + method_label(method[len("auto:"):])
    base, sep, rest = method.partition(":")
    path = Path(base)
    name = path.parent.name if path.name == "export" and path.parent.name else path.name
    return name + sep + rest
