"""`specblock-decode`: batch decoding of a JSONL prompt file into a JSONL result file.

Input: one `{"id": str, "prompt": str}` per line. Output: one line per finished prompt with its
completion, token ids and statistics, appended batch by batch and flushed, so a killed job loses
at most the batch in flight; rerunning the same command skips ids already in the output (resume).
Bad records (invalid JSON, missing fields, empty or overlong prompts, duplicate ids) are skipped
with their line number and reason; the job goes on.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from tqdm import tqdm

import specblock_jax as sbj
from specblock_jax.decoding.generate import encode_prompts

log = logging.getLogger("specblock-decode")
DEFAULT_TARGET = "assets/target"
DEFAULT_TOKENIZER = "assets/tokenizer"


def read_prompts(path: Path) -> tuple[list[dict], list[str]]:
    """Valid records and one message per skipped line ("line N: reason")."""
    records, skipped, seen = [], [], set()
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                skipped.append(f"line {n}: invalid JSON ({e.msg})")
                continue
            if not isinstance(rec, dict) or not isinstance(rec.get("prompt"), str) or "id" not in rec:
                skipped.append(f"line {n}: expected an object with 'id' and a string 'prompt'")
            elif not rec["prompt"]:
                skipped.append(f"line {n} (id {rec['id']!r}): empty prompt")
            elif str(rec["id"]) in seen:
                skipped.append(f"line {n} (id {rec['id']!r}): duplicate id")
            else:
                seen.add(str(rec["id"]))
                records.append({"id": str(rec["id"]), "prompt": rec["prompt"], "line": n})
    return records, skipped


def done_ids(out: Path) -> set[str]:
    """Ids already written to the output. A torn last line (a kill mid-write) is cut off."""
    ids = set()
    if out.exists():
        data = out.read_bytes()
        if data and not data.endswith(b"\n"):
            data = data[: data.rfind(b"\n") + 1]
            out.write_bytes(data)
            log.warning("%s: removed a torn last line", out)
        for line in data.decode("utf-8").splitlines():
            try:
                ids.add(str(json.loads(line)["id"]))
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
    return ids


def load(args) -> sbj.Target:
    if args.random_target:
        tok = sbj.models.load_tokenizer(DEFAULT_TOKENIZER)
        cfg = sbj.models.config.tiny(vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                                     eos_token_ids=(tok.eos_token_id,), max_position_embeddings=4096)
        return sbj.init_target(cfg, seed=args.seed, tokenizer=tok)
    target = sbj.load_target(args.target)
    if target.tokenizer is None:
        raise SystemExit(f"{args.target}: the checkpoint has no tokenizer files; text prompts need one")
    return target


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="specblock-decode", description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=Path, required=True, help="JSONL with {id, prompt} per line")
    p.add_argument("--out", type=Path, required=True, help="JSONL results (appended; resumable)")
    p.add_argument("--target", default=DEFAULT_TARGET, help="HF checkpoint folder (default %(default)s)")
    p.add_argument("--random-target", action="store_true",
                   help="use a randomly initialised tiny Qwen3 with the shipped tokenizer (smoke tests)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--limit", type=int, default=None, help="decode only the first N prompts")
    return p.parse_args(argv)


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    args = parse_args(argv)
    if not args.prompts.exists():
        raise SystemExit(f"{args.prompts}: prompt file not found")
    target = load(args)
    records, skipped = read_prompts(args.prompts)
    records = records[: args.limit] if args.limit else records
    limit = target.config.max_position_embeddings
    todo = []
    finished = done_ids(args.out)
    for rec in records:
        if rec["id"] in finished:
            continue
        n = len(encode_prompts(target, [rec["prompt"]])[0])
        if n + args.max_new_tokens > limit:
            skipped.append(f"line {rec['line']} (id {rec['id']!r}): {n} prompt tokens + "
                           f"{args.max_new_tokens} new tokens exceed the model's {limit} positions")
            continue
        todo.append((n, rec))
    for msg in skipped:
        log.warning("skipped %s", msg)
    log.info("%d prompts to decode, %d already done, %d skipped", len(todo),
             len(finished & {r["id"] for r in records}), len(skipped))
    todo.sort(key=lambda x: x[0])  # similar lengths share a batch and a length bucket
    args.out.parent.mkdir(parents=True, exist_ok=True)
    totals = {"new_tokens": 0, "run_s": 0.0, "compile_s": 0.0}
    with args.out.open("a", encoding="utf-8") as out, tqdm(total=len(todo), desc="decode") as bar:
        for start in range(0, len(todo), args.batch_size):
            batch = [rec for _, rec in todo[start:start + args.batch_size]]
            t0 = time.perf_counter()
            results = sbj.generate(
                target, [r["prompt"] for r in batch], temperature=args.temperature, top_k=args.top_k,
                top_p=args.top_p, max_new_tokens=args.max_new_tokens, seed=args.seed,
                batch_size=args.batch_size,
            )
            compile_s = results[0].stats["compile_s"]
            totals["compile_s"] += compile_s
            totals["run_s"] += time.perf_counter() - t0 - compile_s
            for rec, res in zip(batch, results):
                totals["new_tokens"] += len(res.token_ids)
                out.write(json.dumps({"id": rec["id"], "completion": res.text,
                                      "token_ids": res.token_ids, "stats": res.stats}) + "\n")
            out.flush()
            bar.update(len(batch))
    tps = totals["new_tokens"] / totals["run_s"] if totals["run_s"] else float("nan")
    print(f"\ndecoded {len(todo)} prompts -> {args.out}")
    print(f"{'method':<14}{'new tokens':>12}{'tokens/s':>12}{'tau':>6}{'compile s':>11}")
    print(f"{'target-only':<14}{totals['new_tokens']:>12}{tps:>12.1f}{1.0:>6.2f}{totals['compile_s']:>11.1f}")
    if skipped:
        print(f"{len(skipped)} records skipped (reasons above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
