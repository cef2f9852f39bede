"""Prompts: JSONL prompt files as `specblock-decode`, `specblock-bench` and the training tools read
them, and the one check and encoding of a prompt that `generate` and the command line share.

One record a line: `{"id", "prompt"}`, optionally with a per-record `max_new_tokens` (an integer
>= 1) and `temperature` (a number >= 0); or, with `conversations=True`, a conversation to answer
(`"messages"` in the OpenAI form or `"conversations"` in ShareGPT's, ending with a user turn).
An id keeps its JSON type (7 stays 7, "7" stays "7"; they are different ids).

    records, errors = read_prompts(Path("prompts.jsonl"))
    # records: {"key", "id", "line", "prompt", "messages", "max_new_tokens", "temperature"} each
    # errors:  {"key": "line N", "id", "line", "error"} each (not UTF-8, invalid JSON, missing
    #          fields, empty prompt, duplicate id, a bad max_new_tokens or temperature)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from specblock_jax import checks
from specblock_jax.jsonl import parse_rows
from specblock_jax.models.target import Target


def id_key(rid) -> str:
    """A record's key by its id, type included (7 and "7" differ): its JSON text."""
    return json.dumps(rid, sort_keys=True, ensure_ascii=False)


def read_prompts(path: Path, conversations: bool = False) -> tuple[list[dict], list[dict]]:
    """(valid records, error records) of a JSONL prompt file, in file order. Records are keyed by
    id (`id_key`), error records by "line N". conversations: conversation records are read (their
    "messages" parsed; "prompt" is then None), else they are error records."""
    records, errors, seen = [], [], set()
    with Path(path).open("rb") as f:
        for n, rec, bad in parse_rows(f):
            rid = rec.get("id") if isinstance(rec, dict) else None
            err, messages = (bad, None) if bad else _check_record(rec, rid, seen, conversations)
            if err:
                errors.append({"key": f"line {n}", "id": rid, "line": n, "error": err})
                continue
            seen.add(id_key(rid))
            records.append({"key": id_key(rid), "id": rid, "line": n, "prompt": rec.get("prompt"),
                            "messages": messages, "max_new_tokens": rec.get("max_new_tokens"),
                            "temperature": rec.get("temperature")})
    return records, errors


def _check_record(rec, rid, seen: set, conversations: bool) -> tuple[str | None, list | None]:
    """(why a parsed line is not a record to decode, or None; a conversation's parsed messages)."""
    if isinstance(rec, dict) and rid is not None and ("messages" in rec or "conversations" in rec):
        from specblock_jax.training import chat  # (loads TFDS, which a prompt file rarely needs)

        err = None if conversations else "a conversation record, not read here (a prompt file of {id, prompt})"
        messages = None
        try:
            messages = chat.parse_record(rec, prompt=True)
        except chat.ChatRecordError as e:
            err = err or str(e)
        return err or ("duplicate id" if id_key(rid) in seen else None) or _field_error(rec), messages
    if not isinstance(rec, dict) or rid is None or not isinstance(rec.get("prompt"), str):
        return "expected an object with 'id' and a string 'prompt' (or 'messages')", None
    if not rec["prompt"]:
        return "empty prompt", None
    if id_key(rid) in seen:
        return "duplicate id", None
    return _field_error(rec), None


def _field_error(rec: dict) -> str | None:
    """The first bad optional field of a record ("<field>: <what is wrong> (got <value>)"), or None."""
    for name, check in (("max_new_tokens", checks.max_new_tokens), ("temperature", checks.temperature)):
        if rec.get(name) is not None:
            try:
                check(rec[name])
            except ValueError as e:
                return str(e)
    return None


def prompt_ids(target: Target, prompt: str | Sequence[int], budget: int | None = None,
               limit: int | None = None) -> list[int]:
    """One prompt's token ids, checked: ValueError with the reason (no prompt index) for an empty
    prompt (text or ids), a text prompt without a tokenizer, ids outside the vocabulary, and, with
    a budget and a cache limit, prompt + budget over the limit. `generate` and `specblock-decode`
    both check prompts here (the API names the prompt's index, the CLI its record)."""
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("empty prompt")
        if target.tokenizer is None:
            raise ValueError("a text prompt needs a tokenizer; the target has none (pass token ids instead)")
        toks = list(target.tokenizer(prompt)["input_ids"])
    else:
        toks = [int(t) for t in prompt]
    if not toks:
        raise ValueError("empty prompt")
    bad = [t for t in toks if not 0 <= t < target.config.vocab_size]
    if bad:
        raise ValueError(f"token ids {bad[:5]} outside [0, {target.config.vocab_size})")
    if budget is not None and limit is not None and len(toks) + budget > limit:
        raise ValueError(f"{len(toks)} prompt tokens + max_new_tokens={budget} exceed the cache limit of "
                         f"{limit} tokens")
    return toks


def encode_prompts(target: Target, prompts: Sequence[str | Sequence[int]]) -> list[list[int]]:
    """Token ids per prompt; strings need the target's tokenizer. Errors name the prompt index."""
    ids = []
    for i, prompt in enumerate(prompts):
        try:
            ids.append(prompt_ids(target, prompt))
        except ValueError as e:
            raise ValueError(f"prompt {i}: {e}") from None
    return ids
