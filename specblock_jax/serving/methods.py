"""Decoding methods by name, as the command-line tools take them: 'ar', a drafter kind without a
folder ('prompt_lookup') or a drafter folder, with ':key=value' overrides, or 'auto:' before one.

    m = resolve_method("auto:assets/drafters/eagle3", target)   # a Method served by an AutoServe
    m = resolve_method("assets/drafters/specblock:rank_tree=false:num_nodes=24", target)
    results = m.generate(target, prompts, max_new_tokens=64)    # the entry point that serves it
    split_adapt("assets/drafters/eagle3:adapt.cost_scale=0")   # -> (method, "cost_scale=0")
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from specblock_jax import overrides as kv
from specblock_jax.decoding.generate import generate
from specblock_jax.drafters import registry
from specblock_jax.drafters.base import LoadedDrafter
from specblock_jax.drafters.io import load_drafter
from specblock_jax.serving.auto import AutoServe


@dataclasses.dataclass
class Method:
    """A resolved method: the drafter that serves it (None: target-only) and, for 'auto:', the
    `AutoServe` that chooses per chunk. `generate` calls the entry point that serves it:
    `AutoServe.generate`, else `sbj.generate`."""

    name: str
    loaded: LoadedDrafter | None  # the drafter with its weights
    auto: AutoServe | None = None

    @property
    def kind(self) -> str:
        """"ar" for target-only decoding, else the drafter's registry kind."""
        return "ar" if self.loaded is None else self.loaded.drafter.kind

    def generate(self, target, prompts, *, adapter=None, **settings):
        """One result per prompt; `settings` as `sbj.generate` takes them (sampling,
        max_new_tokens, seed, options, on_batch)."""
        if self.auto is not None:
            if adapter is not None:
                raise ValueError("auto: serving-time adaptation does not combine with auto serving yet")
            return self.auto.generate(target, prompts, **settings)
        return generate(target, prompts, self.loaded, adapter=adapter, **settings)


def weightless_kinds() -> tuple[str, ...]:
    """Kinds that need no folder ("prompt_lookup"): a method may name them directly."""
    return tuple(k for k in registry.kinds() if not registry.get(k).weights)


def parse_method(method: str) -> tuple[str, dict]:
    """'NAME[:key=value[:key=value...]]' -> (NAME, decoding overrides). NAME is ar, prompt_lookup
    or a drafter folder; values parse as int, float, true/false or text, e.g.
    'assets/drafters/specblock:rank_tree=false:num_nodes=24'. ValueError on a malformed pair."""
    base, *pairs = method.split(":")
    return base, kv.parse(pairs, f"method {method!r}:")


AUTO = "auto:"  # 'auto:METHOD' serves METHOD or target-only, whichever is faster (serving/auto.py)


def check_method(method: str) -> None:
    """ValueError unless `method` names ar, prompt_lookup or a drafter folder (no file is read
    but the folder's config.json existence), or is 'auto:' followed by prompt_lookup or a folder."""
    if method.startswith(AUTO):
        method = method[len(AUTO):]
        if parse_method(method)[0] == "ar":
            raise ValueError("auto: needs a drafter method to weigh against target-only decoding")
    base, overrides = parse_method(method)
    builtin = ("ar", *weightless_kinds())
    if base not in builtin and not (Path(base) / "config.json").exists():
        where = f"{base}: no config.json there" if Path(base).is_dir() else f"{base}: no such drafter folder"
        raise ValueError(f"method {method!r}: {where}; expected one of {builtin} or a drafter folder, "
                         "optionally followed by :key=value decoding overrides")
    if base == "ar" and overrides:
        raise ValueError(f"method {method!r}: ar takes no settings")


def resolve_method(method: str, target, chat: dict | None = None) -> Method:
    """'ar' | 'prompt_lookup' | a drafter folder, each with optional ':key=value' overrides -> its
    `Method`; 'auto:METHOD' one served by an `AutoServe` of it (its budget and half of it, and
    target-only). ValueError for a bad method or setting. chat: the chat format served
    (`load_drafter` refuses a drafter trained on another)."""
    check_method(method)
    if method.startswith(AUTO):
        inner = resolve_method(method[len(AUTO):], target, chat=chat)
        return Method(method, inner.loaded, AutoServe(inner.loaded, budgets=None))
    base, overrides = parse_method(method)
    if base == "ar":
        return Method(method, None)
    try:
        return Method(method, load_drafter(base, target, chat=chat, **overrides))
    except TypeError as e:
        raise ValueError(f"method {method!r}: {e}") from None


def split_adapt(method: str) -> tuple[str, str | None]:
    """Separates serving-time adaptation keys from a method: ':adapt=true' turns adaptation on,
    ':adapt.KEY=VALUE' (an AdaptConfig key) turns it on with that setting. Returns (the method
    without them, comma-joined settings or None when adaptation is off)."""
    rest, taken = kv.take(method, lambda key: key == "adapt" or key.startswith("adapt."))
    settings, on = [], False
    for key, value in taken:
        if key == "adapt":
            on = value.lower() in ("true", "1", "yes")
        else:
            on = True
            settings.append(f"{key[len('adapt.'):]}={value}")
    return rest, ",".join(settings) if on else None
