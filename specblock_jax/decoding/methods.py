"""Decoding methods by name: what `generate` takes as `drafter`, and the method strings of the
command-line tools ('ar', 'prompt_lookup' or a drafter folder, with ':key=value' overrides).

    resolve_drafter(None | "ar" | "prompt_lookup" | Drafter | LoadedDrafter)   # drafter_arg.py
    resolve_method("auto:assets/drafters/eagle3", target)      # an AutoServe (decoding/auto.py)
    resolve_method("assets/drafters/specblock:rank_tree=false:num_nodes=24", target)
    split_adapt("assets/drafters/eagle3:adapt.cost_scale=0")   # -> (method, "cost_scale=0")
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specblock_jax.decoding.auto import AutoServe
from specblock_jax.decoding.drafter_arg import drafter_kind, resolve_drafter  # noqa: F401 (re-exported)
from specblock_jax.drafters.io import load_drafter
from specblock_jax.drafters.prompt_lookup import PromptLookup

BUILTIN_METHODS = ("ar", "prompt_lookup")


def parse_method(method: str) -> tuple[str, dict]:
    """'NAME[:key=value[:key=value...]]' -> (NAME, decoding overrides). NAME is ar, prompt_lookup
    or a drafter folder; values parse as int, float, true/false or text, e.g.
    'assets/drafters/specblock:rank_tree=false:num_nodes=24'. ValueError on a malformed pair."""
    base, *pairs = method.split(":")
    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"method {method!r}: {pair!r} is not key=value")
        overrides[key] = _parse_value(raw)
    return base, overrides


def _parse_value(raw: str) -> Any:
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw


AUTO = "auto:"  # 'auto:METHOD' serves METHOD or target-only, whichever is faster (decoding/auto.py)


def check_method(method: str) -> None:
    """ValueError unless `method` names ar, prompt_lookup or a drafter folder (no file is read
    but the folder's config.json existence), or is 'auto:' followed by prompt_lookup or a folder."""
    if method.startswith(AUTO):
        method = method[len(AUTO):]
        if parse_method(method)[0] == "ar":
            raise ValueError("auto: needs a drafter method to weigh against target-only decoding")
    base, overrides = parse_method(method)
    if base not in BUILTIN_METHODS and not (Path(base) / "config.json").exists():
        raise ValueError(f"method {method!r}: expected one of {BUILTIN_METHODS} or a drafter folder, "
                         "optionally followed by :key=value decoding overrides")
    if base == "ar" and overrides:
        raise ValueError(f"method {method!r}: ar takes no settings")


def resolve_method(method: str, target, chat: dict | None = None) -> Any:
    """'ar' | 'prompt_lookup' | a drafter folder, each with optional ':key=value' overrides
    -> what `generate` takes as `drafter`; 'auto:METHOD' an `AutoServe` of it (its budget and half
    of it, and target-only). ValueError for a bad method or setting. chat: the chat format served
    (`load_drafter` refuses a drafter trained on another)."""
    check_method(method)
    if method.startswith(AUTO):
        return AutoServe(resolve_method(method[len(AUTO):], target, chat=chat), budgets=None)
    base, overrides = parse_method(method)
    if base == "ar":
        return None
    try:
        if base == "prompt_lookup":
            return PromptLookup(**overrides)
        return load_drafter(base, target, chat=chat, **overrides)
    except TypeError as e:
        raise ValueError(f"method {method!r}: {e}") from None


def split_adapt(method: str) -> tuple[str, str | None]:
    """Separates serving-time adaptation keys from a method: ':adapt=true' turns adaptation on,
    ':adapt.KEY=VALUE' (an AdaptConfig key) turns it on with that setting. Returns (the method
    without them, comma-joined settings or None when adaptation is off)."""
    base, *pairs = method.split(":")
    keep, settings, on = [base], [], False
    for pair in pairs:
        key, _, value = pair.partition("=")
        if key == "adapt":
            on = value.lower() in ("true", "1", "yes")
        elif key.startswith("adapt."):
            on = True
            settings.append(f"{key[len('adapt.'):]}={value}")
        else:
            keep.append(pair)
    return ":".join(keep), ",".join(settings) if on else None
