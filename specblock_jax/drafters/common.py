"""Scaffolding shared by the drafters that condition on the target's hidden states (EAGLE-3,
SpecBlock, DFlash): the default feature layers, model init and abstract templates, the target's LM
head, loading a drafter folder's config and weights, and the prologue of their training tasks."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from specblock_jax.drafters import draft_vocab, hf_format
from specblock_jax.drafters.base import LoadedDrafter
from specblock_jax.drafters.io import check_target, fill_params, load_weights, save_drafter
from specblock_jax.models.config import ModelConfig, RopeConfig
from specblock_jax.models.target import Target


def default_feature_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's target layers {2, L/2, L-3} (HF hidden_states indexing); a target with fewer
    than 8 layers gets {1, L/2, L-1} (distinct layers)."""
    n = num_layers
    return (2, n // 2, n - 3) if n >= 8 else (1, (n + 1) // 2, n - 1)


@dataclasses.dataclass(frozen=True)
class TargetWidths:
    """The target's widths a drafter layer shares, and the target layers it reads (features)."""

    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    feature_layers: tuple[int, ...]  # HF hidden_states indices
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = RopeConfig()
    dtype: str = "float32"
    draft_vocab_size: int = 0  # the LM head's ids: a reduced draft vocabulary, 0 = the target's all

    @property
    def head_size(self) -> int:
        return self.draft_vocab_size or self.vocab_size

    @classmethod
    def for_target(cls, cfg: ModelConfig, feature_layers: tuple[int, ...] | None = None, **kw):
        """The target's widths; features default to `default_feature_layers`; `kw` sets the
        subclass's own fields."""
        return cls(cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                   cfg.vocab_size, tuple(feature_layers or default_feature_layers(cfg.num_layers)),
                   cfg.rms_norm_eps, cfg.rope, cfg.dtype, **kw)


def abstract_model(model_cls: type, config: Any) -> tuple[nnx.GraphDef, dict]:
    """(graphdef, params template of ShapeDtypeStructs) of `model_cls(config)`, nothing allocated."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: model_cls(config, rngs=nnx.Rngs(0))))
    return graphdef, nnx.to_pure_dict(state)


def init_model(model_cls: type, config: Any, seed: int = 0, lm_head: jax.Array | None = None
               ) -> tuple[nnx.GraphDef, dict]:
    """(graphdef, trainable params) of `model_cls(config)`; lm_head [H, V] optionally starts from
    the target's head (copied: the drafter's never aliases the target's buffer)."""
    graphdef, state = nnx.split(model_cls(config, rngs=nnx.Rngs(seed)))
    params = nnx.to_pure_dict(state)
    if lm_head is not None:
        params["lm_head"] = jnp.array(lm_head, params["lm_head"].dtype, copy=True)
    return graphdef, params


def target_head(target: Target) -> jax.Array:
    """The target's LM head [H, V] (the transposed embedding when tied)."""
    return nnx.merge(target.graphdef, target.params).head_weight()


def config_from_meta(config_cls: type, meta: dict, dtype: str):
    """A drafter config dataclass from a folder's `config.json` "config" (rope and
    feature_layers restored to their types), in `dtype`."""
    raw = dict(meta["config"])
    raw["rope"] = RopeConfig(**raw["rope"])
    raw["feature_layers"] = tuple(raw["feature_layers"])
    return config_cls(**{**raw, "dtype": dtype})


def load_model(path: Path, meta: dict, target: Target, dtype: str, config_cls: type, model_cls: type):
    """(config, graphdef, decoding params) of a drafter folder whose model conditions on `target`
    (vocabulary, width and feature layers checked against it). The params are {"draft": its
    weights, "embed": the target's embedding}, plus {"d2t", "t2d"} of a reduced draft vocabulary
    (checked against the head and the target's vocabulary)."""
    config = config_from_meta(config_cls, meta, dtype)
    check_target(path, config.vocab_size, config.hidden_size, config.feature_layers, target)
    graphdef, template = abstract_model(model_cls, config)
    size = getattr(config, "draft_vocab_size", 0)  # DFlash drafts with the target's own head
    if meta.get("hf_format"):  # a serving engine's layout (drafters/hf_format.py)
        flat, vocab = hf_format.read_weights(path, meta, config, target)
        draft = fill_params(template, flat, jnp.dtype(config.dtype), str(path))
        if vocab is not None:  # its d2t against the head size the config declares
            draft_vocab.validate(vocab, config.vocab_size, size, str(path))
    else:
        draft = load_weights(path, template, config.dtype)
        vocab = draft_vocab.load(path, config.vocab_size, size) if size else None
    params = {"draft": draft, "embed": target.params["embed_tokens"]}
    if vocab is not None:
        params.update(d2t=jnp.asarray(vocab.d2t), t2d=jnp.asarray(vocab.t2d))
    return config, graphdef, params


def vocab_arrays(params: dict) -> tuple[jax.Array, jax.Array] | None:
    """(d2t, t2d) of decoding params with a reduced draft vocabulary, else None."""
    return (params["d2t"], params["t2d"]) if "d2t" in params else None


class FeatureDrafterTask:
    """The part of a `TrainTask` shared by drafters trained on the frozen target's features.

    Subclasses set `self.config` and `self.graphdef` (via `setup`) and implement `loss_fn` and
    `drafter()` (the decoding-side drafter with this run's settings). The decoding params are
    {"draft": trainable params, "embed": the target's embedding} plus `extra_decoding_params()`.
    """

    init_head_from_target = True  # start the drafter's lm_head from the target's

    def setup(self, settings: Any, target: Target, config: Any, model_cls: type) -> None:
        """Also loads the reduced draft vocabulary of settings with `draft_vocab_size` > 0 from the
        map at `settings.draft_vocab` (drafters/draft_vocab.py)."""
        self.settings, self.target, self.config, self.model_cls = settings, target, config, model_cls
        self.graphdef, _ = abstract_model(model_cls, config)
        self.vocab = None
        size = getattr(settings, "draft_vocab_size", 0)
        if size:
            if not settings.draft_vocab:
                raise ValueError("draft_vocab_size is set but no draft_vocab map was given "
                                 "(specblock-train counts one from the training data)")
            self.vocab = draft_vocab.load(settings.draft_vocab, target.config.vocab_size, size)

    def initial_head(self) -> jax.Array | None:
        """The drafter's initial lm_head: the target's (its draft-vocabulary columns), or None for
        a random one."""
        if not self.init_head_from_target:
            return None
        head = target_head(self.target)
        return head if self.vocab is None else head[:, self.vocab.d2t]

    def vocab_arrays(self) -> tuple[jax.Array, jax.Array] | None:
        """(d2t, t2d) of the reduced draft vocabulary, or None."""
        return None if self.vocab is None else (jnp.asarray(self.vocab.d2t), jnp.asarray(self.vocab.t2d))

    def init_params(self, key):
        seed = int(jax.random.randint(key, (), 0, 2**31 - 1))
        return init_model(self.model_cls, self.config, seed, lm_head=self.initial_head())[1]

    def frozen(self):
        return self.target.params

    def extra_decoding_params(self) -> dict:
        return {}

    def decoding_drafter(self, params):
        bundle = {"draft": params, "embed": self.target.params["embed_tokens"], **self.extra_decoding_params()}
        if self.vocab is not None:
            bundle.update(zip(("d2t", "t2d"), self.vocab_arrays()))
        return LoadedDrafter(self.drafter(), bundle)

    def export(self, params, out_dir: str) -> None:
        save_drafter(self.drafter(), params, out_dir, vocab=self.vocab)


def row_buckets(rows: int) -> tuple[int, ...]:
    """Row counts an `update` may run at: 2, 4, 8, ... while a bucket is well below `rows` (under
    4/5 of it), then `rows` itself. Each bucket compiles the update once more, so near-equal
    sizes are not worth one: 9 rows -> (2, 4, 9)."""
    out, r = [], 2
    while r * 5 < rows * 4:
        out.append(r)
        r *= 2
    return tuple(out) + (rows,)


_FORCED_BUCKET: contextvars.ContextVar[int | None] = contextvars.ContextVar("sbj_row_bucket", default=None)


@contextlib.contextmanager
def forced_row_bucket(count: int | None):
    """While tracing, `switch_on_rows` runs only the bucket that holds `count` rows (None: the
    switch). For pricing: XLA's cost analysis prices a `lax.switch` at its costliest branch, so
    the update is priced per bucket this way (aot `price_method(row_bucket=...)`)."""
    token = _FORCED_BUCKET.set(count)
    try:
        yield
    finally:
        _FORCED_BUCKET.reset(token)


def bucket_of(count: int, rows: int) -> int:
    """The bucket of `row_buckets(rows)` a step that committed `count` rows runs at."""
    buckets = row_buckets(rows)
    return next((b for b in buckets if b >= count), buckets[-1])


def switch_on_rows(count: jax.Array, rows: int, fn, *operands):
    """fn(r, *operands) for the smallest bucket r of `row_buckets(rows)` that holds max(count)
    ([B] rows each sequence needs), by `lax.switch`: an `update` then runs the rows this step
    committed instead of the most it could have. Every branch must return the same shapes.
    Under `forced_row_bucket(n)` (tracing for a price) only the bucket holding n runs."""
    if _FORCED_BUCKET.get() is not None:
        return fn(bucket_of(_FORCED_BUCKET.get(), rows), *operands)
    buckets = row_buckets(rows)
    index = jnp.searchsorted(jnp.asarray(buckets, jnp.int32), jnp.max(count).astype(jnp.int32))
    branches = [lambda *ops, r=r: fn(r, *ops) for r in buckets]
    return jax.lax.switch(jnp.minimum(index, len(buckets) - 1), branches, *operands)


def settings_fields(settings: Any, names: tuple[str, ...]) -> dict:
    """{name: value} of the dataclass `settings` for `names` (decoding settings of a task)."""
    return {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings) if f.name in names}
