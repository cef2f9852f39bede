"""JSONL prompt files, as `specblock-decode`, `specblock-bench` and the training tools read them.

One record a line: `{"id", "prompt"}`, optionally with a per-record `max_new_tokens` (an integer
>= 1) and `temperature` (a number >= 0); or, with `conversations=True`, a conversation to answer
(`"messages"` in the OpenAI form or `"conversations"` in ShareGPT's, ending with a user turn).

    records, errors = read_prompts(Path("prompts.jsonl"))
    # records: {"key", "id", "line", "prompt", "messages", "max_new_tokens", "temperature"} each
    # errors:  {"key": "line N", "id", "line", "error"} each (invalid JSON, missing fields, ...)
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from specblock_jax import checks
from specblock_jax.jsonl import parse_lines
from specblock_jax.models.target import Target


def read_prompts(path: Path, conversations: bool = False) -> tuple[list[dict], list[dict]]:
    """(valid records, error records) of a JSONL prompt file, in file order. Records are keyed by
    id, error records by "line N". conversations: conversation records are read (their "messages"
    parsed; "prompt" is then None), else they are error records."""
    records, errors, seen = [], [], set()
    with Path(path).open(encoding="utf-8") as f:
        for n, rec, bad_json in parse_lines(f):
            if bad_json is not None:
                errors.append({"key": f"line {n}", "id": None, "line": n, "error": f"invalid JSON ({bad_json})"})
                continue
            rid = str(rec["id"]) if isinstance(rec, dict) and rec.get("id") is not None else None
            err, messages = None, None
            if isinstance(rec, dict) and rid is not None and ("messages" in rec or "conversations" in rec):
                # imported here: specblock_jax.training loads TFDS, which a prompt file rarely needs
                from specblock_jax.training import chat

                if not conversations:
                    err = "a conversation record, not read here (a prompt file of {id, prompt})"
                try:
                    messages = chat.parse_record(rec, prompt=True)
                except chat.ChatRecordError as e:
                    err = err or str(e)
            elif not isinstance(rec, dict) or rid is None or not isinstance(rec.get("prompt"), str):
                err = "expected an object with 'id' and a string 'prompt' (or 'messages')"
            elif not rec["prompt"]:
                err = "empty prompt"
            elif rid in seen:
                err = "duplicate id"
            else:
                err = _field_error(rec)
            if err:
                errors.append({"key": f"line {n}", "id": rid, "line": n, "error": err})
                continue
            seen.add(rid)
            records.append({"key": rid, "id": rid, "line": n, "prompt": rec.get("prompt"), "messages": messages,
                            "max_new_tokens": rec.get("max_new_tokens"), "temperature": rec.get("temperature")})
    return records, errors


def _field_error(rec: dict) -> str | None:
    """The first bad optional field of a record ("<field>: <what is wrong> (got <value>)"), or None."""
    for name, check in (("max_new_tokens", checks.max_new_tokens), ("temperature", checks.temperature)):
        if rec.get(name) is not None:
            try:
                check(rec[name])
            except ValueError as e:
                return str(e)
    return None


def encode_prompts(target: Target, prompts: Sequence[str | Sequence[int]]) -> list[list[int]]:
    """Token ids per prompt; strings need the target's tokenizer. Errors name the prompt index."""
    ids = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            if target.tokenizer is None:
                raise ValueError(f"prompt {i}: a text prompt needs a tokenizer; the target has none "
                                 "(pass token ids instead)")
            toks = list(target.tokenizer(prompt)["input_ids"])
        else:
            toks = [int(t) for t in prompt]
        if not toks:
            raise ValueError(f"prompt {i}: empty prompt")
        bad = [t for t in toks if not 0 <= t < target.config.vocab_size]
        if bad:
            raise ValueError(f"prompt {i}: token ids {bad[:5]} outside [0, {target.config.vocab_size})")
        ids.append(toks)
    return ids
