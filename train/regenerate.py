"""Drafter training data by regeneration: the target answers every training prompt itself.

Speculative drafters learn to predict the target's own outputs, so each prompt is answered by the
target once per mode (`greedy`: temperature 0; `sampled`: `--temperature`, `--top-k`, `--top-p`).

    python -m train.regenerate --target assets/target --prompts assets/prompts/train.jsonl \
        --out data/regen/train --max-new-tokens 256 --modes greedy,sampled --temperature 1.0 \
        --seed 0 --batch-size 16 [--limit N] [--random-target] [--tfds-dir data/tfds/train]

Output folder:
  <mode>.jsonl    one record per (prompt, mode), appended and flushed batch by batch:
                  {"id", "mode", "prompt", "response", "prompt_ids", "response_ids", "finish_reason"}
                  prompt_ids start with BOS; response_ids are the new tokens, ending with EOS when
                  the target stopped by itself (finish_reason "stop"), else "length".
  settings.json   the generation settings; a rerun with different ones is refused (no mixing).
  summary.json    counts, mean response tokens, finish reasons, skipped records, times.

--tfds-dir: afterwards, (re)build the `specblock_regen` TFDS dataset of everything in --out there
(see specblock_jax.training.regen_dataset); rerunning a finished job only rebuilds it.

Conversations: `--conversations chats.jsonl` (OpenAI `messages` or ShareGPT `conversations` per
line) instead of --prompts regenerates every assistant turn in the target tokenizer's chat template
(`--chat-template FILE.jinja` to give one, `--thinking on|off` for Qwen3's switch, recorded in
settings.json as "chat" and carried into the drafters trained on the data); records carry an
assistant-only loss mask. See train/regenerate_chat.py.

Resume: rerunning the same command skips (id, mode) pairs already written; a torn last line
(a kill mid-write) is cut off. Bad input lines (invalid JSON, missing fields, empty prompts,
duplicate ids, prompt tokens + max_new_tokens beyond the model's positions) are skipped and
logged with their line number and reason.

Sampled key streams: each `sbj.generate` call gets a seed hashed from (--seed, mode, the ids of its
batch), so an identical run is reproducible and different batches never share random numbers.
A resumed run re-batches the pending prompts, so their samples differ from an uninterrupted run's
(they are equally valid samples of the target).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import time
from collections import Counter
from pathlib import Path

from tqdm import tqdm

import specblock_jax as sbj
from specblock_jax import jsonl
from specblock_jax.prompts import encode_prompts
from specblock_jax.training import chat
from specblock_jax.training.regen_dataset import MODES, build_tfds, built_splits, read_records

from . import regenerate_chat

log = logging.getLogger("regenerate")
SETTING_KEYS = ("target", "random_target", "max_new_tokens", "temperature", "top_k", "top_p", "seed")


def read_prompts(path: Path) -> tuple[list[dict], list[str]]:
    """Valid {id, prompt, line} records in file order, and one "line N: reason" per skipped line
    (the rules of `specblock-decode`'s prompt files)."""
    records, errors = sbj.read_prompts(path)
    skipped = [f"line {e['line']}" + (f" (id {e['id']!r})" if e["id"] is not None else "") + f": {e['error']}"
               for e in sorted(errors, key=lambda e: e["line"])]
    # ids as text: the regen data keys examples by string ids (an integer 7 becomes "7")
    return [{"id": str(r["id"]), "prompt": r["prompt"], "line": r["line"]} for r in records], skipped


def done_ids(path: Path) -> set[str]:
    """Ids already in an output file; a torn last line (a kill mid-write) is cut off the file."""
    return {str(r["id"]) for r in read_records(path, torn="cut")}


def load(args: argparse.Namespace) -> sbj.Target:
    """The checkpoint at --target, or with --random-target a random tiny Qwen3 (4096 positions)."""
    try:
        return sbj.models.load_text_target(None if args.random_target else args.target, seed=args.seed)
    except sbj.CheckpointError as e:
        raise SystemExit(str(e)) from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="regenerate", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="assets/target", help="HF checkpoint folder (default %(default)s)")
    p.add_argument("--random-target", action="store_true",
                   help="use a randomly initialised tiny Qwen3 with the shipped tokenizer (smoke tests)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompts", type=Path, help="JSONL with {id, prompt} per line")
    src.add_argument("--conversations", type=Path,
                     help="JSONL conversations (OpenAI messages or ShareGPT): regenerate the assistant turns")
    p.add_argument("--chat-template", type=Path, default=None,
                   help="Jinja chat template file (default: the target tokenizer's own)")
    p.add_argument("--thinking", choices=("on", "off", "default"), default="default",
                   help="Qwen3's enable_thinking template switch (default: the template's default)")
    p.add_argument("--max-len", type=int, default=0,
                   help="conversations: skip those longer than this many tokens (0 = the model's positions)")
    p.add_argument("--out", type=Path, required=True, help="output folder (resumable)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--modes", default="greedy,sampled", help=f"comma-separated subset of {MODES}")
    p.add_argument("--temperature", type=float, default=1.0, help="temperature of the sampled mode")
    p.add_argument("--top-k", type=int, default=0, help="top-k of the sampled mode (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="top-p of the sampled mode")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--limit", type=int, default=None, help="use only the first N valid prompts")
    p.add_argument("--mesh", default=None,
                   help="device mesh of this process, e.g. model=8: the target sharded over local chips")
    p.add_argument("--shard", default=None,
                   help="I/N: keep every N-th input record from the I-th (one process per host, each "
                        "with its own --out; concatenate the <mode>.jsonl files afterwards)")
    p.add_argument("--tfds-dir", type=Path, default=None,
                   help="then build the specblock_regen TFDS dataset into this data_dir")
    args = p.parse_args(argv)
    if args.shard is not None:
        i, _, n = args.shard.partition("/")
        if not (i.isdigit() and n.isdigit() and int(i) < int(n)):
            p.error(f"--shard {args.shard!r}: expected I/N with 0 <= I < N")
        args.shard = (int(i), int(n))
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in args.modes if m not in MODES]
    if bad or not args.modes:
        p.error(f"--modes: unknown {bad}; choose from {MODES}")
    if args.temperature <= 0 and "sampled" in args.modes:
        p.error("--temperature must be > 0 for the sampled mode")
    return args


def chat_format(args: argparse.Namespace) -> chat.ChatFormat:
    return chat.ChatFormat(enable_thinking={"on": True, "off": False}.get(args.thinking))


def check_settings(args: argparse.Namespace, tok=None) -> dict:
    """Writes settings.json on the first run; refuses a rerun whose settings differ. `tok`: the
    chat tokenizer of a conversation run (its format is recorded as "chat")."""
    settings = {k: getattr(args, k) for k in SETTING_KEYS}
    if tok is not None:
        settings["chat"] = chat_format(args).record(tok)
    path = args.out / "settings.json"
    if path.exists():
        old = json.loads(path.read_text(encoding="utf-8"))
        diff = {k: (old.get(k), v) for k, v in settings.items() if old.get(k) != v}
        if diff:
            raise SystemExit(f"{args.out} was generated with other settings {diff} (old, new); "
                             "use another --out folder")
    else:
        path.write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    return settings


def valid_prompts(target: sbj.Target, args: argparse.Namespace) -> tuple[list[dict], list[str]]:
    """Records {id, prompt, line, prompt_ids} of the first --limit usable prompts, and skip reasons."""
    records, skipped = read_prompts(args.prompts)
    limit = target.config.max_position_embeddings
    out = []
    for rec in records:
        if args.limit is not None and len(out) >= args.limit:
            break
        ids = encode_prompts(target, [rec["prompt"]])[0]
        if len(ids) + args.max_new_tokens > limit:
            skipped.append(f"line {rec['line']} (id {rec['id']!r}): {len(ids)} prompt tokens + "
                           f"{args.max_new_tokens} new tokens exceed the model's {limit} positions")
            continue
        out.append({**rec, "prompt_ids": ids})
    return out, skipped


def batch_seed(seed: int, mode: str, ids: list[str]) -> int:
    """A 31-bit seed hashed from the run seed, the mode and the batch's ids."""
    digest = hashlib.sha256(json.dumps([seed, mode, ids]).encode()).digest()
    return int.from_bytes(digest[:4], "little") >> 1


def run_mode(target: sbj.Target, mode: str, todo: list[dict], args: argparse.Namespace,
             bar: tqdm) -> dict[str, float]:
    """Generates `todo` (sorted by length) batch by batch, appending to <out>/<mode>.jsonl."""
    temp, top_k, top_p = (0.0, 0, 1.0) if mode == "greedy" else (args.temperature, args.top_k, args.top_p)
    times = {"run_s": 0.0, "compile_s": 0.0}
    with jsonl.Appender(args.out / f"{mode}.jsonl", ensure_ascii=True) as out:  # (regen_archive.record_line)
        for start in range(0, len(todo), args.batch_size):
            batch = todo[start:start + args.batch_size]
            t0 = time.perf_counter()
            results = sbj.generate(target, [r["prompt_ids"] for r in batch], max_new_tokens=args.max_new_tokens,
                                   seed=batch_seed(args.seed, mode, [r["id"] for r in batch]),
                                   sampling=sbj.Sampling(temperature=temp, top_k=top_k, top_p=top_p),
                                   options=sbj.DecodeOptions(batch_size=args.batch_size, mesh=args.mesh_obj))
            compile_s = results[0].stats.compile_s
            times["compile_s"] += compile_s
            times["run_s"] += time.perf_counter() - t0 - compile_s
            out.write_many({  # the batch's lines in one write
                "id": rec["id"], "mode": mode, "prompt": rec["prompt"],
                "response": target.tokenizer.decode(res.token_ids, skip_special_tokens=True),
                "prompt_ids": rec["prompt_ids"], "response_ids": res.token_ids,
                "finish_reason": res.stats.finish_reason,
            } for rec, res in zip(batch, results))
            bar.update(len(batch))
    return times


def summarize(args: argparse.Namespace, settings: dict, skipped: list[str], n_valid: int,
              times: dict[str, dict[str, float]], wall_s: float) -> dict:
    """summary.json over everything in the output folder (all runs), plus this run's times."""
    modes = {}
    for mode in args.modes:
        recs = read_records(args.out / f"{mode}.jsonl")
        n = len(recs)
        new = sum(len(r["response_ids"]) for r in recs)
        modes[mode] = {
            "records": n,
            "mean_prompt_tokens": sum(len(r["prompt_ids"]) for r in recs) / n if n else 0.0,
            "mean_response_tokens": new / n if n else 0.0,
            "response_tokens": new,
            "finish_reasons": dict(Counter(r["finish_reason"] for r in recs)),
            "this_run": times.get(mode, {}),
        }
    return {
        "settings": settings, "prompts_file": str(args.prompts or args.conversations), "limit": args.limit,
        "batch_size": args.batch_size, "valid_prompts": n_valid, "skipped": len(skipped),
        "skipped_reasons": skipped[:50], "modes": modes, "this_run_wall_s": round(wall_s, 2),
    }


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    args = parse_args(argv)
    source = args.prompts or args.conversations
    if not source.exists():
        raise SystemExit(f"{source}: input file not found")
    t_start = time.perf_counter()
    target = load(args)
    args.mesh_obj = None
    if args.mesh:
        try:
            args.mesh_obj = sbj.parallel.make_mesh(args.mesh)
        except ValueError as e:
            raise SystemExit(f"--mesh: {e}") from None
        target = target.replace(params=sbj.parallel.ShardingPlan(args.mesh_obj).put(target.params))
    tok = regenerate_chat.load_chat_tokenizer(target, args.chat_template) if args.conversations else None
    args.out.mkdir(parents=True, exist_ok=True)
    settings = check_settings(args, tok)
    if tok is None:
        records, skipped = valid_prompts(target, args)
    else:
        records, reasons = chat.read_conversations(args.conversations)
        records = records[:args.limit] if args.limit is not None else records
        skipped = [f"{n} records: {reason}" for reason, n in reasons.most_common()]
    for msg in skipped:
        log.warning("skipped %s", msg)
    if args.shard is not None:
        records = records[args.shard[0]::args.shard[1]]
    pending = {}
    for mode in args.modes:
        done = done_ids(args.out / f"{mode}.jsonl")
        if tok is None:
            todo = [r for r in records if r["id"] not in done]
            pending[mode] = sorted(todo, key=lambda r: len(r["prompt_ids"]))  # similar lengths batch together
        else:
            pending[mode] = [c for c in records if c.id not in done]
        log.info("%s: %d %s to generate, %d already done", mode, len(pending[mode]),
                 "prompts" if tok is None else "conversations", len(records) - len(pending[mode]))
    times = {}
    with tqdm(total=sum(len(v) for v in pending.values()), desc="regenerate", unit="rec") as bar:
        for mode in args.modes:
            if tok is None:
                times[mode] = run_mode(target, mode, pending[mode], args, bar)
            else:
                times[mode] = regenerate_chat.run_chat_mode(
                    target, tok, chat_format(args), mode, pending[mode], args, bar,
                    lambda m, ids: batch_seed(args.seed, m, ids))
                for reason, n in times[mode]["dropped"].items():
                    log.warning("%s: dropped %d conversations: %s", mode, n, reason)
    summary = summarize(args, settings, skipped, len(records), times, time.perf_counter() - t_start)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    for mode, s in summary["modes"].items():
        print(f"{mode:<8} {s['records']:>6} records  mean response {s['mean_response_tokens']:.1f} "
              f"tokens  finish {s['finish_reasons']}")
    print(f"{len(skipped)} skip reasons (above); wrote {args.out}")
    if args.tfds_dir is not None:
        print(built_splits(build_tfds(args.out, args.tfds_dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
