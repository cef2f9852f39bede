"""Regeneration of conversations: the target rewrites every assistant turn in its chat format.

`python -m train.regenerate --conversations chats.jsonl --out DIR [--thinking on|off]` (see
train/regenerate.py for the shared options). Turn by turn, across all pending conversations of a
mode, the target reads the conversation so far (earlier assistant turns already replaced by its
own) through the tokenizer's chat template with the generation prompt, and writes the next
assistant turn. A record is then the regenerated conversation rendered by the same template:

    {"id", "mode", "messages", "prompt_ids", "response_ids", "assistant_mask", "finish_reasons",
     "finish_reason"}

prompt_ids + response_ids are the rendered ids, split where the last assistant turn starts;
assistant_mask [n] marks every assistant turn (the drafter learns those tokens only;
`chat.render`). Conversations that outgrow the model's positions (or --max-len) are skipped with
the reason; skipped input records are counted by reason.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

import specblock_jax as sbj
from specblock_jax.training import chat


def load_chat_tokenizer(target: sbj.Target, template_path: Path | None):
    """The target's tokenizer for conversations (`chat.chat_tokenizer`), with the chat template
    from `template_path` if given."""
    template = Path(template_path).read_text(encoding="utf-8") if template_path is not None else None
    try:
        return chat.chat_tokenizer(target.tokenizer, template)
    except ValueError as e:
        raise SystemExit(f"{e} (--chat-template FILE.jinja)") from None


def last_turn_start(mask: np.ndarray) -> int:
    """Index where the last run of ones in `mask` starts (the last assistant turn)."""
    ones = np.flatnonzero(mask)
    if ones.size == 0:
        raise chat.ChatRecordError("no assistant tokens after rendering")
    gaps = np.flatnonzero(np.diff(ones) > 1)
    return int(ones[gaps[-1] + 1] if gaps.size else ones[0])


def _reply_text(tok, ids: list[int], stops: set[int]) -> str:
    if ids and ids[-1] in stops:
        ids = ids[:-1]
    return tok.decode(ids, skip_special_tokens=False)


def run_chat_mode(target: sbj.Target, tok, fmt: chat.ChatFormat, mode: str, todo: list[chat.Conversation],
                  args, bar: tqdm, seed_fn) -> dict:
    """Regenerates `todo` turn by turn, appending finished conversations to <out>/<mode>.jsonl.
    Returns this run's times and the per-reason counts of conversations dropped while rendering."""
    temp, top_k, top_p = (0.0, 0, 1.0) if mode == "greedy" else (args.temperature, args.top_k, args.top_p)
    limit = min(target.config.max_position_embeddings, args.max_len or 1 << 30)
    stops = set(target.config.eos_token_ids) | ({tok.eos_token_id} if tok.eos_token_id is not None else set())
    live = {c.id: {"conv": c, "messages": [], "finish": [], "next": 0} for c in todo}
    times, dropped = {"run_s": 0.0, "compile_s": 0.0}, {}

    def drop(cid, reason):
        dropped[reason] = dropped.get(reason, 0) + 1
        live.pop(cid)
        bar.update(1)

    with (args.out / f"{mode}.jsonl").open("a", encoding="utf-8") as f:
        while live:
            # Advance every conversation to its next assistant turn; collect the prompts.
            prompts = []
            for cid, st in list(live.items()):
                msgs = st["conv"].messages
                while st["next"] < len(msgs) and msgs[st["next"]]["role"] != "assistant":
                    st["messages"].append(dict(msgs[st["next"]]))
                    st["next"] += 1
                if st["next"] == len(msgs):
                    continue
                ids = chat.generation_prompt(tok, st["messages"], fmt)
                if len(ids) + args.max_new_tokens > limit:
                    drop(cid, f"over-long: {len(ids)} prompt tokens + {args.max_new_tokens} new > {limit}")
                    continue
                prompts.append((cid, ids))
            for start in range(0, len(prompts), args.batch_size):
                batch = prompts[start:start + args.batch_size]
                t0 = time.perf_counter()
                results = sbj.generate(target, [ids for _, ids in batch], max_new_tokens=args.max_new_tokens,
                                       seed=seed_fn(mode, [c for c, _ in batch]),
                                       sampling=sbj.Sampling(temperature=temp, top_k=top_k, top_p=top_p),
                                       options=sbj.DecodeOptions(batch_size=args.batch_size, mesh=args.mesh_obj))
                compile_s = results[0].stats.compile_s
                times["compile_s"] += compile_s
                times["run_s"] += time.perf_counter() - t0 - compile_s
                for (cid, _), res in zip(batch, results):
                    st = live[cid]
                    st["messages"].append({"role": "assistant", "content": _reply_text(tok, res.token_ids, stops)})
                    st["finish"].append(res.stats.finish_reason)
                    st["next"] += 1
            for cid, st in list(live.items()):  # conversations with no assistant turn left: done
                if any(m["role"] == "assistant" for m in st["conv"].messages[st["next"]:]):
                    continue
                try:
                    ids, mask = chat.render(tok, st["messages"], fmt, max_len=limit)
                    cut = last_turn_start(mask)
                except chat.ChatRecordError as e:
                    drop(cid, str(e))
                    continue
                f.write(json.dumps({
                    "id": cid, "mode": mode, "messages": st["messages"],
                    "prompt_ids": ids[:cut].tolist(), "response_ids": ids[cut:].tolist(),
                    "assistant_mask": mask.tolist(), "finish_reasons": st["finish"],
                    "finish_reason": st["finish"][-1],
                }) + "\n")
                f.flush()
                live.pop(cid)
                bar.update(1)
    return {**times, "dropped": dropped}
