"""Conversation data (training/chat.py, train/regenerate_chat.py): both JSONL forms, the chat
template's ids and assistant masks against `apply_chat_template`, the thinking switch, bad
records, assistant-only losses, and regeneration that keeps the template."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specblock_jax.training import chat
from specblock_jax.training.regen_dataset import pack_example, record_mask
from chat_fixtures import QWEN3_STYLE_TEMPLATE, chat_tokenizer

MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Write a function that sorts a list."},
            {"role": "assistant", "content": "Sure, here is one: sorted(xs)"},
            {"role": "user", "content": "What is two plus two?"},
            {"role": "assistant", "content": "It is four."}]
SHAREGPT = {"conversations": [{"from": {"system": "system", "user": "human", "assistant": "gpt"}[m["role"]],
                               "value": m["content"]} for m in MESSAGES]}


@pytest.fixture(scope="module")
def tok():
    return chat_tokenizer()


def _write(path, lines):
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")


@pytest.mark.parametrize("thinking", [None, False, True])
def test_both_forms_give_the_templates_ids_and_assistant_masks(tok, tmp_path, thinking):
    _write(tmp_path / "c.jsonl", [{"id": "oa", "messages": MESSAGES}, {"id": "sg", **SHAREGPT}])
    convs, skipped = chat.read_conversations(tmp_path / "c.jsonl")
    assert [c.id for c in convs] == ["oa", "sg"] and not skipped
    fmt = chat.ChatFormat(enable_thinking=thinking)
    kw = {} if thinking is None else {"enable_thinking": thinking}
    ref = tok.apply_chat_template(MESSAGES, tokenize=True, return_dict=True, return_assistant_tokens_mask=True, **kw)
    for conv in convs:
        ids, mask = chat.render(tok, conv.messages, fmt)
        assert ids.tolist() == ref["input_ids"] and mask.tolist() == ref["assistant_masks"]
        # the mask covers exactly the two assistant turns and their end-of-turn tokens
        text = tok.decode(ids[mask > 0].tolist())
        assert "sorted(xs)" in text and "It is four." in text and "two plus two" not in text
        assert text.count("<|im_end|>") == 2


def test_turn_markers_mask_a_template_without_generation_tags_the_same(tok):
    plain = chat_tokenizer(QWEN3_STYLE_TEMPLATE.replace("{%- generation -%}", "").replace("{%- endgeneration -%}", ""))
    for thinking in (None, False):
        fmt = chat.ChatFormat(enable_thinking=thinking)
        a, b = chat.render(tok, MESSAGES, fmt), chat.render(plain, MESSAGES, fmt)
        assert a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist()


def test_the_thinking_switch_changes_the_ids_and_is_recorded(tok):
    off, on = chat.ChatFormat(enable_thinking=False), chat.ChatFormat(enable_thinking=True)
    ids_off, _ = chat.render(tok, MESSAGES, off)
    ids_on, _ = chat.render(tok, MESSAGES, on)
    assert ids_off.tolist() != ids_on.tolist()
    assert "<think>" in tok.decode(chat.generation_prompt(tok, MESSAGES[:2], off))
    assert "<think>" not in tok.decode(chat.generation_prompt(tok, MESSAGES[:2], on))
    assert off.record(tok)["enable_thinking"] is False and on.record(tok)["enable_thinking"] is True
    assert off.record(tok)["chat_template_sha256"] == on.record(tok)["chat_template_sha256"]
    assert chat_tokenizer("{{ messages }}").chat_template != tok.chat_template


def test_bad_records_are_skipped_with_counted_reasons(tok, tmp_path):
    _write(tmp_path / "c.jsonl", [
        {"id": "ok", "messages": MESSAGES[1:3]},
        {"id": "tool", "messages": [{"role": "tool", "content": "x"}, MESSAGES[2]]},
        {"id": "empty", "conversations": [{"from": "human", "value": "  "}, {"from": "gpt", "value": "x"}]},
        {"id": "noasst", "messages": [MESSAGES[1]]},
        {"id": "ok", "messages": MESSAGES[1:3]},
        {"id": "form", "prompt": "hi"},
        "not json",
    ])
    convs, skipped = chat.read_conversations(tmp_path / "c.jsonl")
    assert [c.id for c in convs] == ["ok"]
    assert skipped == {"unknown role 'tool'": 1, "empty user turn": 1, "no assistant turn": 1, "duplicate id": 1,
                       "no 'messages' or 'conversations' list": 1, "invalid JSON": 1}
    with pytest.raises(chat.ChatRecordError, match="over-long"):
        chat.render(tok, MESSAGES, max_len=10)


def test_losses_fall_on_assistant_tokens_only(tok):
    ids, mask = chat.render(tok, MESSAGES)
    cut = int(np.flatnonzero(mask)[-1])  # any split: the mask decides
    rec = {"prompt_ids": ids[:cut].tolist(), "response_ids": ids[cut:].tolist(), "assistant_mask": mask.tolist()}
    tokens, loss, attn = pack_example(rec["prompt_ids"], rec["response_ids"], 128, 0, record_mask(rec))
    n = len(ids)
    assert attn[:n].all() and not attn[n:].any()
    np.testing.assert_array_equal(loss[:n - 1], mask[1:])  # position i predicts token i + 1
    assert not loss[n - 1:].any()
    legacy = {"prompt_ids": [0, 5, 6], "response_ids": [7, 8, 1]}
    assert pack_example([0, 5, 6], [7, 8, 1], 8, 2, record_mask(legacy))[1].tolist() == \
        pack_example([0, 5, 6], [7, 8, 1], 8, 2)[1].tolist()
    with pytest.raises(ValueError, match="assistant_mask has 2 entries"):
        record_mask({**legacy, "id": "x", "assistant_mask": [0, 1]})
