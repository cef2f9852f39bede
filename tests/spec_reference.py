"""Slow, obviously-correct pure-Python references for tree masks and verification (tests only)."""

from __future__ import annotations

import numpy as np


def ancestors(parents, i):
    out = []
    while i >= 0:
        out.append(i)
        i = parents[i]
    return out[::-1]  # root first


def ancestor_mask(parents):
    n = len(parents)
    m = np.zeros((n, n), bool)
    for i in range(n):
        m[i, ancestors(parents, i)] = True
    return m


def children(parents, valid, u):
    return [j for j in range(1, len(parents)) if valid[j] and parents[j] == u]


def verify_greedy(tokens, parents, valid, logits):
    """Walk down from the root: follow the first child whose token is the target's argmax."""
    want = np.argmax(logits, axis=-1)
    best, best_depth = 0, 0
    for j in range(len(parents)):
        path = ancestors(parents, j)
        if all(valid[k] and tokens[k] == want[parents[k]] for k in path[1:]):
            if len(path) - 1 > best_depth:
                best, best_depth = j, len(path) - 1
    path = ancestors(parents, best)
    return path, [int(tokens[k]) for k in path[1:]] + [int(want[best])]


def sample_from(p, u):
    cdf = np.cumsum(p)
    return int(min(np.searchsorted(cdf, u * cdf[-1], side="right"), len(p) - 1))


def verify_sampling(tokens, parents, valid, p, q, u_accept, u_bonus, max_children):
    """Recursive rejection sampling, written as the textbook loop. p [N, V] target probs per
    node, q [N, V] draft distributions (None -> one-hot on each node's token)."""
    v = p.shape[1]
    cur, path = 0, [0]
    while True:
        resid = p[cur].astype(np.float64).copy()
        accepted = None
        for j in children(parents, valid, cur)[:max_children]:
            x = tokens[j]
            qj = np.eye(v)[x] if q is None else q[j].astype(np.float64)
            if u_accept[j] * qj[x] < resid[x]:
                accepted = j
                break
            left = np.maximum(resid - qj, 0)
            if left.sum() > 0:
                resid = left / left.sum()
        if accepted is None:
            bonus = sample_from(resid, u_bonus[cur])
            return path, [int(tokens[k]) for k in path[1:]] + [bonus]
        path.append(accepted)
        cur = accepted
