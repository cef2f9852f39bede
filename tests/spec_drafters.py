"""Test drafters that propose random trees (shapes, validity and tokens), deterministic or sampled."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specblock_jax.trees import DraftTree, ancestor_mask


@dataclasses.dataclass(frozen=True)
class RandomTreeDrafter:
    """Random trees of `num_nodes` nodes. Deterministic mode: uniform random tokens (q = one-hot).
    Stochastic mode: each child is sampled from q(. | parent token) = softmax(params[parent token]),
    a fixed distribution far from the target's; siblings are i.i.d. draws from it."""

    num_nodes: int
    vocab: int
    stochastic: bool = False
    max_children: int = 4
    keep_prob: float = 0.85
    hidden_ids: tuple[int, ...] = ()
    per_row_keys: bool = False  # each row's tree from its own key (independent of the batch)
    sizing: str = "fixed"  # the whole tree every step (step sizing's tests set "auto": tests/test_sizing.py)
    scored: bool = False  # give DraftTree.scores: path products of q of each node's token (stochastic)

    forwards_per_step = property(lambda self: 0)  # no network forwards

    def init_state(self, params, prefill, max_len):
        return ()

    def propose(self, params, state, ctx, key):
        b, n = ctx.root.shape[0], self.num_nodes

        def one(k, root):
            k_par, k_val, k_tok = jax.random.split(k, 3)
            j = jnp.arange(n)
            parents = jnp.floor(jax.random.uniform(k_par, (n,)) * j).astype(jnp.int32)
            parents = parents.at[0].set(-1)
            raw = jax.random.bernoulli(k_val, self.keep_prob, (n,)).at[0].set(True)
            tokens = jnp.zeros((n,), jnp.int32).at[0].set(root)
            probs = jnp.zeros((n, self.vocab))
            keys = jax.random.split(k_tok, n)
            for i in range(1, n):  # parents come first, so their tokens are known
                q = jax.nn.softmax(params[tokens[parents[i]]]) if self.stochastic else (
                    jnp.full((self.vocab,), 1.0 / self.vocab))
                tok = jax.random.categorical(keys[i], jnp.log(q))
                tokens = tokens.at[i].set(tok)
                probs = probs.at[i].set(q)
            return tokens, parents, raw, probs

        row_keys = key if self.per_row_keys else jax.random.split(key[0], b)
        tokens, parents, raw, probs = jax.vmap(one)(row_keys, ctx.root)
        anc = ancestor_mask(parents)
        valid = jnp.all(~anc | raw[:, None, :], axis=-1)
        scores = None
        if self.scored:  # the product over the node and its ancestors of q(token)
            q_tok = jnp.take_along_axis(probs, tokens[:, :, None], axis=2)[:, :, 0].at[:, 0].set(1.0)
            scores = jnp.exp(jnp.sum(jnp.where(anc, jnp.log(jnp.maximum(q_tok, 1e-30))[:, None, :], 0.0), -1))
        tree = DraftTree(tokens, parents, valid, probs if self.stochastic else None, scores)
        return tree, state

    def update(self, params, state, ctx, result, hidden):
        return state


def skewed_draft_params(vocab: int, seed: int = 0) -> jax.Array:
    """[V, V] logits for q(. | token): peaked on an arbitrary token, far from any target."""
    return jax.random.normal(jax.random.key(seed), (vocab, vocab)) * 2.5
