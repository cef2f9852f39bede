"""Issue 58 items 3-4 and the targets: BlockPilot's labels, its two policies and their held-out test,
from the committed per-request tau tables (labels/<split>/size_<s>.jsonl, made by run.sh's labels stage) and the
v5p-priced step of each size (costs_v5p.json, made by price_sizes.py).

Labels, per prompt, over the window's sizes (default B-2..B+2 = 6..10 around the shipped DFlash's
training block 8; `--window 6,12` for the wider one):
  ref    the reference's: the size of highest tau, ties to the smallest size;
  speed  ours: the size of highest priced speed, tau / priced step ms (v5p, Qwen3-8B, batch 1),
         ties to the smallest size.
Policies (features from the target's prefill logits, one forward per prompt, its last token):
  reference  raw logits (V = 8192), Linear(V -> 2048) -> ReLU -> Dropout 0.2 -> [ReLU(Linear(2048 ->
             2048)) + residual] -> Dropout -> Linear(2048 -> C), cross-entropy on the ref labels;
  ours       top-32 probabilities + entropy, width 256, pre-ReLU residual, cross-entropy on the
             speed labels (drafters/blockpilot/_model.py).
Both train full-batch with AdamW (weight decay 0.05); the learning rate and the step count are
picked by 5-fold cross-validation on the training prompts (the fold-mean tau of the chosen sizes
for the reference, their mean priced speed for ours), then each refits on all training prompts
and is scored once on held-out and HumanEval.

Scored at batch 1, T = 0 (per request, from the tables: a greedy row's tau does not depend on its
batch): mean tau, and priced speedup = tau x target-only step / the size's step (per request, then
averaged); against the best fixed size chosen on the training prompts, with a paired bootstrap 95%
interval of the mean difference, and the share of the oracle's gain reached. At batch 8 (held-out
prompts in file order, 8 a batch; priced at batch 8): per-row sizes (one step at the batch's largest
chosen size, each row drafting and verifying its own: the batch runs max over rows of the row's
forwards at its own size), the batch-largest rule (every row at that size) and the best fixed size.

    python benchmarks/blockpilot_window/evaluate.py [--window 6,10] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import specblock_jax as sbj
from specblock_jax.drafters.blockpilot import PolicyConfig, features, init_policy, prefill_features, save_blockpilot

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SPLITS = {"train": "train.jsonl", "heldout": "heldout.jsonl", "humaneval": "humaneval.jsonl"}
POLICIES = {
    "reference": dict(features="logits", width=2048, residual="post_relu", labels="ref", select="tau"),
    "ours": dict(features="topk", width=256, residual="pre_relu", labels="speed", select="speed"),
}
GRID = {"lr": (3e-4, 1e-3), "steps": (25, 50, 100, 200)}


def read_table(folder: Path, sizes: list[int]) -> dict:
    """{"ids", "tau", "forwards", "new_tokens"} [n, S] over the prompts every size has."""
    rows = {}
    for s in sizes:
        path = folder / f"size_{s}.jsonl"
        if not path.exists():
            raise SystemExit(f"{path}: missing (run STAGES=labels sh benchmarks/blockpilot_window/run.sh)")
        rows[s] = {r["id"]: r for r in map(json.loads, path.read_text().splitlines())}
    ids = [i for i in rows[sizes[0]] if all(i in rows[s] for s in sizes)]
    get = lambda key: np.asarray([[rows[s][i][key] or 1.0 for s in sizes] for i in ids], np.float64)  # noqa: E731
    return {"ids": ids, "tau": get("tau"), "forwards": get("forwards") - 1, "new_tokens": get("new_tokens") - 1}


def first_best(score: np.ndarray) -> np.ndarray:
    """[n, S] -> [n] index of each row's highest score, ties (1e-12) to the smallest size."""
    return np.argmax(score >= score.max(1, keepdims=True) - 1e-12, axis=1)


def fit(cfg: PolicyConfig, x: np.ndarray, y: np.ndarray, lr: float, steps: tuple[int, ...], seed: int = 0) -> dict:
    """Full-batch AdamW with dropout 0.2 on (x [n, F], y [n]); {step: params} at each of `steps`."""
    graphdef, params = init_policy(cfg, seed)
    params["mean"], params["std"] = jnp.asarray(x.mean(0)), jnp.asarray(x.std(0) + 1e-6)
    frozen = {k: params.pop(k) for k in ("mean", "std")}
    tx = optax.adamw(lr, weight_decay=0.05)
    opt = tx.init(params)
    xb, yb = jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.int32)

    @jax.jit
    def step(params, opt, key):
        def loss(p):
            logits = nnx.merge(graphdef, {**p, **frozen})(xb, 0.2, key)
            return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()
        g = jax.grad(loss)(params)
        upd, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, upd), opt

    out, key = {}, jax.random.key(seed)
    for i in range(1, max(steps) + 1):
        key, sub = jax.random.split(key)
        params, opt = step(params, opt, sub)
        if i in steps:
            out[i] = ({**params, **frozen}, graphdef)
    return out


def predict(fitted, x: np.ndarray) -> np.ndarray:
    params, graphdef = fitted
    return np.asarray(jnp.argmax(nnx.merge(graphdef, params)(jnp.asarray(x, jnp.float32)), -1))


def bootstrap(diff: np.ndarray, n: int = 10000, seed: int = 0) -> tuple[float, float]:
    """Paired bootstrap 95% interval of mean(diff) over prompts."""
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), (n, len(diff)))].mean(1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def score_batch1(choice: np.ndarray, fixed: dict, t: dict) -> dict:
    """Per-request tau and priced speedup of `choice` [n] against the best fixed size on the training
    prompts (by tau for tau, by priced speed for speed: `fixed` {"tau", "speed"} indices) and the oracle."""
    n = np.arange(len(choice))
    out = {}
    for name, m, f in (("tau", t["tau"], fixed["tau"]), ("priced_speedup", t["speed"], fixed["speed"])):
        chosen, base, best = m[n, choice], m[:, f], m.max(1)
        lo, hi = bootstrap(chosen - base)
        gain = best.mean() - base.mean()
        out[name] = {"policy": float(chosen.mean()), "best_fixed": float(base.mean()), "oracle": float(best.mean()),
                     "diff": float((chosen - base).mean()), "diff_ci95": [lo, hi],
                     "share_of_oracle_gain": float((chosen.mean() - base.mean()) / gain) if gain > 0 else None,
                     "met": bool(lo >= 0 and gain > 0 and (chosen.mean() - base.mean()) >= 0.5 * gain)}
    return out


def score_batch8(choice: np.ndarray, fixed: int, t: dict, cost8: np.ndarray, target8: float) -> dict:
    """Held-out in file order, 8 rows a batch, priced at batch 8 (module docstring)."""
    def run(size_of_row):  # [n] size index each row runs at -> (mean tau, priced speedup, per-batch steps)
        time_ms = base_ms = tau = 0.0
        for start in range(0, len(choice), 8):
            rows = np.arange(start, min(start + 8, len(choice)))
            run_at = size_of_row[rows]
            compiled = run_at.max()  # the batch's one step is compiled at its largest size
            steps = t["forwards"][rows, run_at].max()
            time_ms += steps * cost8[compiled]
            base_ms += t["new_tokens"][rows, 0].max() * target8
            tau += t["tau"][rows, run_at].sum()
        return tau / len(choice), base_ms / time_ms

    largest = np.concatenate([np.full(min(8, len(choice) - s), choice[s:s + 8].max()) for s in range(0, len(choice), 8)])
    out = {}
    for name, rows in (("per_row", choice), ("batch_largest", largest), ("best_fixed", np.full(len(choice), fixed))):
        tau, speed = run(rows)
        out[name] = {"tau": float(tau), "priced_speedup": float(speed)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--window", default="6,10", help="LOW,HIGH: the candidate sizes")
    ap.add_argument("--labels", type=Path, default=HERE / "labels")
    ap.add_argument("--costs", type=Path, default=HERE / "costs_v5p.json")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--export", type=Path, default=None, help="save the policies here (<dir>/<policy>/)")
    args = ap.parse_args()
    lo, hi = map(int, args.window.split(","))
    sizes = list(range(lo, hi + 1))
    costs = json.loads(args.costs.read_text())
    cost1 = np.asarray([costs["step_ms"][str(s)] for s in sizes])
    cost8 = np.asarray([costs["step_ms_batch8"][str(s)] for s in sizes])
    t1, t8 = costs["target_ms"]["1"], costs["target_ms"]["8"]
    start = time.perf_counter()
    target = sbj.load_target(ROOT / "assets/target")
    tables, logits = {}, {}
    for split, file in SPLITS.items():
        t = tables[split] = read_table(args.labels / split, sizes)
        recs = {r["id"]: r["prompt"] for r in sbj.read_prompts(ROOT / "assets/prompts" / file)[0]}
        logits[split] = prefill_features(target, [recs[i] for i in t["ids"]], "logits", 0)
        t["speed"] = t["tau"] * t1 / cost1  # per-request priced speedup at batch 1
        t["labels"] = {"ref": first_best(t["tau"]), "speed": first_best(t["speed"])}
    train = tables["train"]
    fixed = {"tau": int(np.argmax(train["tau"].mean(0))), "speed": int(np.argmax(train["speed"].mean(0)))}
    out = {"date": time.strftime("%Y-%m-%d"), "window": sizes, "costs": str(args.costs.relative_to(ROOT)),
           "prompts": {s: len(t["ids"]) for s, t in tables.items()},
           "best_fixed_on_train": {k: sizes[v] for k, v in fixed.items()},
           "mean_tau": {s: dict(zip(map(str, sizes), t["tau"].mean(0).round(4).tolist())) for s, t in tables.items()},
           "label_counts": {s: {k: np.bincount(v, minlength=len(sizes)).tolist() for k, v in t["labels"].items()}
                            for s, t in tables.items()},
           "ties_at_all_sizes": {s: float(np.mean(np.all(t["forwards"] == t["forwards"][:, :1], 1)))
                                 for s, t in tables.items()},
           "policies": {}}
    folds = np.arange(len(train["ids"])) % 5
    for name, p in POLICIES.items():
        cfg = PolicyConfig(tuple(sizes), p["features"], 32, target.config.vocab_size, p["width"], p["residual"])
        feats = {s: np.asarray(features(jnp.asarray(logits[s]), p["features"], 32)) for s in tables}
        y = train["labels"][p["labels"]]
        metric = train["tau"] if p["select"] == "tau" else train["speed"]
        cv = {}
        for lr in GRID["lr"]:
            scores = {n: [] for n in GRID["steps"]}
            for k in range(5):
                fitted = fit(cfg, feats["train"][folds != k], y[folds != k], lr, GRID["steps"])
                for n, f in fitted.items():
                    pick = predict(f, feats["train"][folds == k])
                    scores[n].append(float(metric[folds == k][np.arange(len(pick)), pick].mean()))
            for n, v in scores.items():
                cv[f"lr={lr},steps={n}"] = float(np.mean(v))
            print(name, lr, {n: round(float(np.mean(v)), 4) for n, v in scores.items()}, flush=True)
        best = max(cv, key=cv.get)
        lr, steps = (float(best.split(",")[0][3:]), int(best.split(",")[1][6:]))
        final = fit(cfg, feats["train"], y, lr, (steps,))[steps]
        res = {"config": {k: v for k, v in p.items()}, "cv": cv, "chosen": {"lr": lr, "steps": steps}}
        for split in ("train", "heldout", "humaneval"):
            t = tables[split]
            pick = predict(final, feats[split])
            oracle = t["labels"][p["labels"]]
            conf = np.zeros((len(sizes), len(sizes)), int)
            np.add.at(conf, (oracle, pick), 1)
            res[split] = {"chosen_counts": np.bincount(pick, minlength=len(sizes)).tolist(),
                          "accuracy": float(np.mean(pick == oracle)),
                          "confusion_oracle_rows_chosen_cols": conf.tolist(),
                          "batch1_T0": score_batch1(pick, fixed, t),
                          "chosen": [sizes[i] for i in pick], "oracle": [sizes[i] for i in oracle]}
            if split == "heldout":
                res[split]["batch8_T0"] = score_batch8(pick, fixed[p["select"]], t, cost8, t8)
        out["policies"][name] = res
        if args.export:
            dflash = ROOT / "assets/drafters/dflash"
            folder = args.export / name
            folder.mkdir(parents=True, exist_ok=True)
            save_blockpilot(folder, cfg, final[0], os.path.relpath(dflash, folder.resolve()), labels_dflash=dflash)
    out["wall_s"] = time.perf_counter() - start
    dest = args.out or HERE / f"results_{lo}-{hi}.json"
    dest.write_text(json.dumps(out, indent=1) + "\n")
    summary = {k: v for k, v in out.items() if k != "policies"}
    print(json.dumps(summary, indent=1))
    for name, res in out["policies"].items():
        for split in ("heldout", "humaneval"):
            print(name, split, json.dumps(res[split]["batch1_T0"]), json.dumps(res[split].get("batch8_T0")))


if __name__ == "__main__":
    main()
