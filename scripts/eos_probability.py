"""Where the target puts probability on EOS: at real file ends vs along greedy HumanEval completions.

    .venv/bin/python scripts/eos_probability.py --target assets/target --files 64 --prompts 164 \
        --max-new-tokens 256 --out docs/eos_probability_v2.json

Training packs each corpus file as BOS + tokens + EOS, so EOS follows only a whole module. This
measures (1) P(EOS) and EOS's rank right after the last token of standard-library validation files
(the context is the file's last `--context` tokens; files of at least 64 tokens), against P(EOS) at every other position of the
same windows; (2) for greedy completions of HumanEval prompts, the highest P(EOS) and best EOS rank
at any position of the completion. Ranks are 1-based (1 = the greedy token).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import specblock_jax as sbj  # noqa: E402
from train.build_corpus import default_stdlib_root, iter_source_files, split_of  # noqa: E402


def eos_stats(target: sbj.Target, ids: list[int], eos: int) -> tuple[np.ndarray, np.ndarray]:
    """P(EOS) and EOS's 1-based rank after each token of `ids` (one sequence): [T], [T]."""
    n = len(ids)
    padded = -(-n // 128) * 128  # right-padded to a multiple of 128: few compiled shapes
    tokens = jnp.asarray([ids + [0] * (padded - n)], jnp.int32)
    mask = jnp.asarray([[1] * n + [0] * (padded - n)], jnp.int32)
    logits = sbj.forward(target, tokens, attention_mask=mask)[0, :n]
    logp = jax.nn.log_softmax(logits, axis=-1)
    p = np.exp(np.asarray(logp[:, eos]))
    rank = 1 + np.asarray(jnp.sum(logits > logits[:, eos:eos + 1], axis=-1))
    return p, rank


def file_ends(target: sbj.Target, n_files: int, context: int, eos: int) -> dict:
    root = default_stdlib_root()
    rels = [r for r in iter_source_files(root) if split_of(r) == "validation"]
    end_p, end_rank, other_p, used = [], [], [], 0
    for rel in rels:
        if used == n_files:
            break
        text = (root / rel).read_text(encoding="utf-8", errors="replace")
        ids = target.tokenizer.encode(text)[-context:]
        if len(ids) < 64:  # empty __init__.py files and stubs: no context to judge
            continue
        used += 1
        p, rank = eos_stats(target, ids, eos)
        end_p.append(float(p[-1]))
        end_rank.append(int(rank[-1]))
        other_p.append(float(np.mean(p[:-1])))
    return {"files": used, "min_tokens": 64, "context_tokens": context,
            "p_eos_at_end_median": float(np.median(end_p)), "p_eos_at_end_mean": float(np.mean(end_p)),
            "eos_rank1_at_end_share": float(np.mean(np.array(end_rank) == 1)),
            "eos_rank_at_end_median": float(np.median(end_rank)),
            "p_eos_elsewhere_mean": float(np.mean(other_p))}


def completions(target: sbj.Target, n_prompts: int, max_new: int, eos: int, prompts_path: Path) -> dict:
    prompts = [json.loads(line)["prompt"] for line in prompts_path.open() if line.strip()][:n_prompts]
    results = sbj.generate(target, prompts, max_new_tokens=max_new, batch_size=8)
    max_p, best_rank, ended = [], [], 0
    for prompt, r in zip(prompts, results):
        ids = target.tokenizer.encode(prompt) + list(r.token_ids)
        n_prompt = len(ids) - len(r.token_ids)
        p, rank = eos_stats(target, ids, eos)
        # positions whose next token is a completion token (or EOS): after the prompt's last token on
        p, rank = p[n_prompt - 1:], rank[n_prompt - 1:]
        max_p.append(float(p.max()))
        best_rank.append(int(rank.min()))
        ended += int(len(r.token_ids) < max_new)
    max_p, best_rank = np.array(max_p), np.array(best_rank)
    return {"prompts": len(prompts), "max_new_tokens": max_new, "ended_on_eos": ended,
            "max_p_eos_median": float(np.median(max_p)), "max_p_eos_max": float(max_p.max()),
            "share_max_p_eos_above_0.01": float(np.mean(max_p > 0.01)),
            "share_max_p_eos_above_0.1": float(np.mean(max_p > 0.1)),
            "best_eos_rank_median": float(np.median(best_rank)),
            "share_eos_ever_in_top5": float(np.mean(best_rank <= 5))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="assets/target")
    p.add_argument("--prompts-file", type=Path, default=Path("assets/prompts/humaneval.jsonl"))
    p.add_argument("--files", type=int, default=64, help="validation files scored at their end")
    p.add_argument("--context", type=int, default=511)
    p.add_argument("--prompts", type=int, default=164)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    target = sbj.load_target(args.target)
    eos = int(target.config.eos_token_ids[0])
    out = {"target": args.target, "eos_id": eos,
           "file_ends": file_ends(target, args.files, args.context, eos),
           "humaneval_greedy": completions(target, args.prompts, args.max_new_tokens, eos, args.prompts_file)}
    print(json.dumps(out, indent=1))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
