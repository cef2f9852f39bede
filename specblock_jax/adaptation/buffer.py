"""The replay buffer of served sequences: static shapes, device-resident, ring-ordered.

Each row keeps a window of at most `window` positions of one served sequence (the last ones when it
is longer): its tokens, the target's hidden states at the drafter's feature layers and masks. A
window's position i is scored (loss_mask) when its next token was generated, not prompt text.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specblock_jax.decoding.compiled import compiled


def _windows(window, history, hist_len, prompt_len, feats):
    """history [B, S], hist_len / prompt_len [B], feats [B, S, n, H] -> per-row windows of the
    last `window` positions: (tokens [B, W], feats [B, W, n, H], valid [B, W], loss_mask [B, W])."""
    b, s = history.shape
    if s < window:  # pad so that every window slice stays inside
        history = jnp.pad(history, ((0, 0), (0, window - s)))
        feats = jnp.pad(feats, ((0, 0), (0, window - s), (0, 0), (0, 0)))
    start = jnp.maximum(hist_len - window, 0)
    tok = jax.vmap(lambda h, st: jax.lax.dynamic_slice_in_dim(h, st, window))(history, start)
    fea = jax.vmap(lambda f, st: jax.lax.dynamic_slice_in_dim(f, st, window))(feats, start)
    idx = jnp.arange(window)[None, :]
    length = (hist_len - start)[:, None]
    first_new = (prompt_len - start)[:, None]  # window index of the first generated token
    valid = idx < length
    tok = jnp.where(valid, tok, 0)
    loss_mask = (idx + 1 >= first_new) & (idx + 1 < length)
    return tok, fea, valid.astype(jnp.int32), loss_mask.astype(jnp.int32)


def _insert(window, data, slots, history, hist_len, prompt_len, feats):
    """Writes the windows of a batch into rows `slots` [B] (a slot >= capacity drops its row)."""
    new = _windows(window, history, hist_len, prompt_len, feats)
    return tuple(d.at[slots].set(x.astype(d.dtype), mode="drop") for d, x in zip(data, new))


@dataclasses.dataclass
class ReplayBuffer:
    """capacity rows of `window` positions; features [capacity, window, n, H] in `dtype`."""

    capacity: int
    window: int
    num_features: int
    hidden_size: int
    dtype: str = "float32"

    def __post_init__(self):
        if self.capacity < 1 or self.window < 2:
            raise ValueError(f"replay buffer: capacity must be >= 1 and window >= 2, got "
                             f"{self.capacity} and {self.window}")
        c, w = self.capacity, self.window
        self.data = (jnp.zeros((c, w), jnp.int32),
                     jnp.zeros((c, w, self.num_features, self.hidden_size), jnp.dtype(self.dtype)),
                     jnp.zeros((c, w), jnp.int32), jnp.zeros((c, w), jnp.int32))
        self.size = 0  # rows filled
        self.next = 0  # ring position of the next row
        self.compile_s = 0.0

    def add(self, history, hist_len, prompt_len, feats, num_rows: int) -> np.ndarray:
        """Adds the first `num_rows` rows of a decoded batch (the rest are padding). Returns the
        slots written (the newest rows; with more rows than capacity, only the last ones)."""
        b = history.shape[0]
        keep = min(num_rows, self.capacity)
        slots = np.full((b,), self.capacity, np.int32)  # dropped
        written = (self.next + np.arange(keep)) % self.capacity
        slots[num_rows - keep:num_rows] = written
        args = (self.data, jnp.asarray(slots), history, hist_len, prompt_len, feats)
        # the buffer is donated: written in place, not copied per add (a copy of a 64-row buffer
        # cost ~22 ms a request here, device work that landed inside the next decode call's time)
        exe, seconds = compiled(_insert, (self.window,), *args, donate_argnums=(0,))
        self.compile_s += seconds
        self.data = exe(*args)
        self.next = int((self.next + keep) % self.capacity)
        self.size = min(self.size + keep, self.capacity)
        return written

    def rows(self, slots) -> dict[str, jax.Array]:
        """The rows at `slots` as a batch: tokens, hidden, valid, loss_mask."""
        idx = jnp.asarray(slots, jnp.int32)
        tok, fea, valid, mask = (d[idx] for d in self.data)
        return {"tokens": tok, "hidden": fea, "valid": valid, "loss_mask": mask}
