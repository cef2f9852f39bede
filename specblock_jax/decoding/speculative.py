"""The speculative decoding loop: draft, verify, accept, commit, all inside one `lax.while_loop`.

Invariant between steps: the KV cache holds every committed token except the last one (the
root), whose K/V the next tree forward computes as node 0. Each step:
  1. the drafter proposes a tree of N nodes rooted at the root;
  2. one target forward over the N nodes under the tree's ancestor mask (positions = cache length
     + depth) writes their K/V after the committed prefix;
  3. verification picks the accepted path and a bonus token (greedy or rejection sampling);
  4. the cache keeps the path's K/V (`compact`), the new tokens are appended, truncated at a stop
     token or the budget, and the bonus becomes the next root.

With `collect` (static), the loop also keeps the target's hidden states at the drafter's feature
layers for every committed position, gathered from the prefill and from each verification
forward's accepted path: free training labels for serving-time adaptation (no extra forward).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specblock_jax.decoding.sampling import sample, sampling_logprobs
from specblock_jax.drafters.base import DraftContext, Prefill
from specblock_jax.models.kv_cache import init_cache
from specblock_jax.models.transformer import apply, causal_mask
from specblock_jax.parallel.activation import constrain_cache
from specblock_jax.trees.tree import ancestor_mask, depths
from specblock_jax.trees.verify import verify_greedy, verify_sampling


def _write_rows(buf: jax.Array, rows: jax.Array, starts: jax.Array) -> jax.Array:
    """buf [B, L, ...], rows [B, N, ...] written at starts [B] (the caller leaves room:
    start + N <= L)."""
    def write(b, r, s):
        return jax.lax.dynamic_update_slice(b, r.astype(b.dtype), (s,) + (0,) * (b.ndim - 1))
    return jax.vmap(write)(buf, rows, starts)


def spec_loop(graphdef, cfg, drafter, cache_len, max_new, greedy, collect, params, drafter_params,
              tokens, lengths, budgets, sampling, stop_ids, keys):
    """tokens [B, P] right-padded prompts with lengths [B]; budgets [B]; keys [B] PRNG keys.

    Static: graphdef, cfg, drafter, cache_len (>= P + max_new + N), max_new, greedy (all
    temperatures are 0), collect. Returns (out [B, max_new + N] int32, generated [B], stopped [B]
    bool, forwards [B] verification forwards per sequence), and with `collect` also
    (history [B, S] prompt + committed tokens, hist_len [B], features [B, S, n, H] the target's
    hidden states at `drafter.hidden_ids` for history positions < hist_len - 1), S = P + max_new + N.
    """
    b, p = tokens.shape
    n = drafter.num_nodes
    cache = constrain_cache(init_cache(cfg, b, cache_len))  # laid out by the mesh, if sharded
    pos = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p))
    hidden_ids = tuple(drafter.hidden_ids)
    fwd = apply(graphdef, params, tokens, pos, causal_mask(b, p), cache, hidden_ids=hidden_ids,
                logit_indices=(lengths - 1)[:, None])
    # logits only at the last prompt token, hidden states at every prompt position
    cache = fwd.cache._replace(lengths=lengths)
    step_keys = lambda step: jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, step)  # noqa: E731
    root = sample(step_keys(0), fwd.logits[:, 0], sampling)
    prefill = Prefill(tokens, lengths, fwd.hidden, fwd.logits[:, 0], root)
    dstate = drafter.init_state(drafter_params, prefill, cache_len)

    hist_size = p + max_new + n
    history = jnp.zeros((b, hist_size), jnp.int32).at[:, :p].set(tokens)
    history = _write_rows(history, root[:, None], lengths)
    out = jnp.full((b, max_new + n), -1, jnp.int32).at[:, 0].set(root)
    stopped = jnp.isin(root, stop_ids)
    done = stopped | (budgets <= 1)
    zeros = jnp.zeros((b,), jnp.int32)
    feats = None
    if collect:  # [B, S + N, n, H]: rows S.. are scratch that finished rows write into
        feats = jnp.zeros((b, hist_size + n) + fwd.hidden.shape[2:], fwd.hidden.dtype)
        feats = feats.at[:, :p].set(fwd.hidden)
    state = (jnp.int32(1), root, jnp.ones((b,), jnp.int32), out, done, stopped, cache, history,
             lengths + 1, dstate, zeros, feats)

    def cond(s):
        return (s[0] <= max_new) & ~jnp.all(s[4])

    def body(s):
        step, root, generated, out, done, stopped, cache, history, hist_len, dstate, forwards, feats = s
        active = ~done
        ctx = DraftContext(history, hist_len, root, cache.lengths)
        key = step_keys(step)
        tree, dstate = drafter.propose(drafter_params, dstate, ctx, jax.vmap(jax.random.fold_in, (0, None))(key, 1))
        tree = tree._replace(tokens=tree.tokens.at[:, 0].set(root))
        anc = ancestor_mask(tree.parents)
        positions = cache.lengths[:, None] + depths(anc)
        fwd = apply(graphdef, params, tree.tokens, positions, anc, cache, hidden_ids=hidden_ids)
        if greedy:
            res = verify_greedy(tree, fwd.logits)
        else:
            logp = sampling_logprobs(fwd.logits, sampling)
            res = verify_sampling(tree, logp, jax.vmap(jax.random.fold_in, (0, None))(key, 2),
                                  drafter.max_children)
        # keep the root and the accepted path's K/V; inactive rows keep nothing
        cache = fwd.cache.compact(res.path, jnp.where(active, res.num_accepted + 1, 0))
        idx = jnp.arange(n)[None, :]
        count = res.num_accepted + 1
        is_stop = jnp.isin(res.new_tokens, stop_ids) & (idx < count[:, None])
        has_stop = jnp.any(is_stop, axis=1)
        upto = jnp.where(has_stop, jnp.argmax(is_stop, axis=1) + 1, count)
        room = budgets - generated
        take = jnp.where(active, jnp.minimum(upto, room), 0)
        out = _write_rows(out, jnp.where(idx < take[:, None], res.new_tokens, -1), generated)
        history = _write_rows(history, res.new_tokens, hist_len)
        if collect:  # the accepted path's hidden states, at the root's history position onward
            path_hidden = jnp.take_along_axis(fwd.hidden, res.path[:, :, None, None], axis=1)
            feats = _write_rows(feats, path_hidden, jnp.where(active, hist_len - 1, hist_size))
        hist_len = hist_len + take
        generated = generated + take
        hit = active & has_stop & (upto <= room)
        new_ctx = DraftContext(history, hist_len, res.bonus, cache.lengths)
        dstate = drafter.update(drafter_params, dstate, new_ctx, res, fwd.hidden)
        return (step + 1, res.bonus, generated, out, done | hit | (generated >= budgets),
                stopped | hit, cache, history, hist_len, dstate, forwards + active, feats)

    final = jax.lax.while_loop(cond, body, state)
    _, _, generated, out, _, stopped, _, history, hist_len, _, forwards, feats = final
    if collect:
        return out, generated, stopped, forwards, history, hist_len, feats[:, :hist_size]
    return out, generated, stopped, forwards
