"""Conversation data: OpenAI `messages` and ShareGPT `conversations` JSONL, rendered with the
target tokenizer's own chat template, with a mask of the assistant's tokens (the only ones a
drafter learns to predict).

    convs, skipped = read_conversations("chats.jsonl")        # skipped: {reason: count}
    fmt = ChatFormat(enable_thinking=False)                    # Qwen3's thinking switch, recorded
    ids, mask = render(tokenizer, convs[0].messages, fmt)      # int32 [n] each
    prompt = generation_prompt(tokenizer, convs[0].messages[:2], fmt)   # ids up to the reply

Both forms become a tuple of {"role": "system" | "user" | "assistant", "content": str}. A record
with an unknown role, an empty turn, no assistant turn, or (at render time) more tokens than the
limit is skipped with its reason.

Assistant masks. A template with `{% generation %}` tags gets transformers' own mask
(`apply_chat_template(..., return_assistant_tokens_mask=True)`). Other templates (Qwen3's and
Llama-3's as released) are masked by their turn markers: every token from the end of an assistant
header through the end of the end-of-turn marker (ChatML: "<|im_start|>assistant\\n" ...
"<|im_end|>"; Llama-3: "<|start_header_id|>assistant<|end_header_id|>\\n\\n" ... "<|eot_id|>"),
found from the template or given in `ChatFormat`. The number of marked spans must equal the
number of assistant turns, or the record is refused: a wrong mask trains the drafter on the
user's words.

The format a drafter was trained with (`ChatFormat.record(tokenizer)`: the template's sha256 and
the thinking switch) goes into its folder's config, so serving can refuse a mismatch
(`sbj.load_drafter(..., chat=fmt.record(tokenizer))`): drafters trained with thinking on and served with it off lose most of their
acceptance.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from specblock_jax.jsonl import parse_lines

ROLES = ("system", "user", "assistant")
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant",
                  "assistant": "assistant"}
# (assistant header, end of turn) of the template families recognised by a marker in the template.
TURN_MARKERS = {"<|im_start|>": ("<|im_start|>assistant\n", "<|im_end|>"),
                "<|start_header_id|>": ("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>")}


class ChatRecordError(ValueError):
    """A conversation record that cannot be used; the message is the reason."""


class Conversation(NamedTuple):
    id: str
    messages: tuple[dict[str, str], ...]
    line: int


@dataclasses.dataclass(frozen=True)
class ChatFormat:
    """How conversations are rendered. enable_thinking: passed to the template (Qwen3's switch);
    None leaves the template's default. assistant_header / end_of_turn: the turn markers of a
    template without `{% generation %}` tags that is not ChatML or Llama-3."""

    enable_thinking: bool | None = None
    assistant_header: str | None = None
    end_of_turn: str | None = None

    def template_kwargs(self) -> dict[str, Any]:
        return {} if self.enable_thinking is None else {"enable_thinking": self.enable_thinking}

    def record(self, tokenizer) -> dict[str, Any]:
        """What a drafter trained on this format records: template hash and thinking switch."""
        return {"chat_template_sha256": template_sha256(tokenizer), "enable_thinking": self.enable_thinking}


def chat_tokenizer(tokenizer, template: str | None = None):
    """A copy of `tokenizer` for rendering conversations: `template` (Jinja text) as its chat
    template if given, and control tokens written in the template's text read as the special ids
    they name (a tokenizer built with `split_special_tokens`, as the embedded one is so that
    source code mentioning "<|eos|>" stays text, would otherwise spell them out)."""
    tok = copy.deepcopy(tokenizer)
    if template is not None:
        tok.chat_template = template
    if not getattr(tok, "chat_template", None):
        raise ValueError("the tokenizer has no chat template: give one (a .jinja file)")
    tok.split_special_tokens = False
    return tok


def template_sha256(tokenizer) -> str:
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError("the tokenizer has no chat template (set tokenizer.chat_template or pass one)")
    return hashlib.sha256(template.encode("utf-8")).hexdigest()


def parse_record(rec: Any, prompt: bool = False) -> tuple[dict[str, str], ...]:
    """The messages of one JSONL record in either form; ChatRecordError with the reason. prompt:
    a conversation to answer (it must end with a user turn) rather than one to learn from (it
    must hold an assistant turn)."""
    if not isinstance(rec, dict):
        raise ChatRecordError("not a JSON object")
    if "messages" in rec:
        turns, role_key, text_key, roles = rec["messages"], "role", "content", {r: r for r in ROLES}
    elif "conversations" in rec:
        turns, role_key, text_key, roles = rec["conversations"], "from", "value", SHAREGPT_ROLES
    else:
        raise ChatRecordError("no 'messages' or 'conversations' list")
    if not isinstance(turns, list) or not turns:
        raise ChatRecordError("empty conversation")
    out = []
    for turn in turns:
        if not isinstance(turn, dict):
            raise ChatRecordError("a turn is not an object")
        role, text = turn.get(role_key), turn.get(text_key)
        if role not in roles:
            raise ChatRecordError(f"unknown role {role!r}")
        if not isinstance(text, str) or not text.strip():
            raise ChatRecordError(f"empty {roles[role]} turn")
        out.append({"role": roles[role], "content": text})
    if prompt and out[-1]["role"] != "user":
        raise ChatRecordError("a conversation to answer must end with a user turn")
    if not prompt and not any(m["role"] == "assistant" for m in out):
        raise ChatRecordError("no assistant turn")
    return tuple(out)


def read_conversations(path: str | Path) -> tuple[list[Conversation], Counter]:
    """The usable conversations of a JSONL file in file order, and {reason: count} of the skipped
    lines (invalid JSON, duplicate ids and `parse_record`'s reasons). Ids default to "line-N"."""
    convs, skipped, seen = [], Counter(), set()
    for n, rec, bad_json in parse_lines(Path(path).read_text(encoding="utf-8").splitlines()):
        if bad_json is not None:
            skipped["invalid JSON"] += 1
            continue
        try:
            messages = parse_record(rec)
        except ChatRecordError as e:
            skipped[str(e)] += 1
            continue
        cid = str(rec.get("id", f"line-{n}"))
        if cid in seen:
            skipped["duplicate id"] += 1
            continue
        seen.add(cid)
        convs.append(Conversation(cid, messages, n))
    return convs, skipped


def _has_generation_tags(template: str) -> bool:
    return "generation" in template and "endgeneration" in template


def turn_markers(tokenizer, fmt: ChatFormat) -> tuple[str, str]:
    """(assistant header, end of turn) for the marker mask: the format's, else the template's."""
    if fmt.assistant_header and fmt.end_of_turn:
        return fmt.assistant_header, fmt.end_of_turn
    template = tokenizer.chat_template or ""
    for marker, pair in TURN_MARKERS.items():
        if marker in template:
            return pair
    raise ValueError("the chat template has no {% generation %} tags and no known turn markers: "
                     "give ChatFormat(assistant_header=..., end_of_turn=...)")


def _marker_mask(tokenizer, text: str, fmt: ChatFormat, turns: int) -> tuple[np.ndarray, np.ndarray]:
    header, end = turn_markers(tokenizer, fmt)
    spans, pos = [], 0
    while (start := text.find(header, pos)) >= 0:
        stop = text.find(end, start + len(header))
        if stop < 0:
            break
        spans.append((start + len(header), stop + len(end)))
        pos = stop + len(end)
    if len(spans) != turns:
        raise ChatRecordError(f"the template's assistant markers mark {len(spans)} spans for {turns} "
                              "assistant turns")
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    offsets = np.asarray(enc["offset_mapping"], np.int64).reshape(-1, 2)
    mask = np.zeros(len(enc["input_ids"]), np.int32)
    for a, b in spans:
        mask |= ((offsets[:, 0] >= a) & (offsets[:, 1] <= b) & (offsets[:, 1] > offsets[:, 0])).astype(np.int32)
    return np.asarray(enc["input_ids"], np.int32), mask


def render(tokenizer, messages, fmt: ChatFormat = ChatFormat(), max_len: int | None = None
           ) -> tuple[np.ndarray, np.ndarray]:
    """(ids, assistant_mask), int32 [n] each, of a whole conversation in the tokenizer's template.
    ChatRecordError when it has more than `max_len` tokens or its assistant turns cannot be
    marked."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError("the tokenizer has no chat template (set tokenizer.chat_template or pass one)")
    messages = list(messages)
    if _has_generation_tags(template):
        out = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True,
                                            return_assistant_tokens_mask=True, **fmt.template_kwargs())
        ids, mask = np.asarray(out["input_ids"], np.int32), np.asarray(out["assistant_masks"], np.int32)
    else:
        text = tokenizer.apply_chat_template(messages, tokenize=False, **fmt.template_kwargs())
        turns = sum(m["role"] == "assistant" for m in messages)
        ids, mask = _marker_mask(tokenizer, text, fmt, turns)
    if max_len is not None and ids.shape[0] > max_len:
        raise ChatRecordError(f"over-long: {ids.shape[0]} tokens > {max_len}")
    return ids, mask


def generation_prompt(tokenizer, messages, fmt: ChatFormat = ChatFormat()) -> list[int]:
    """Token ids of `messages` (ending before an assistant turn) with the template's generation
    prompt: what the target reads before it writes the next assistant turn."""
    return list(tokenizer.apply_chat_template(list(messages), tokenize=True, return_dict=True,
                                              add_generation_prompt=True, **fmt.template_kwargs())["input_ids"])
