"""The conversation recipe end to end on a tiny chat target: regenerate the assistant turns in the
target's chat format, train an EAGLE-3 drafter on them (the chat format recorded and checked at
load), export it in the speculators layout and fine-tune it from there."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

import specblock_jax as sbj
from specblock_jax.drafters.io import flatten_params
from specblock_jax.training import chat
from specblock_jax_cli.infer import decode
from specblock_jax_cli.train import cli, regenerate
from chat_fixtures import chat_tokenizer

CONVERSATIONS = [
    {"id": "a", "messages": [{"role": "system", "content": "You are a helpful assistant."},
                             {"role": "user", "content": "Write a function that sorts a list."},
                             {"role": "assistant", "content": "Sure, here is one: sorted(xs)"},
                             {"role": "user", "content": "What is two plus two?"},
                             {"role": "assistant", "content": "It is four."}]},
    {"id": "b", "conversations": [{"from": "human", "value": "hello world"}, {"from": "gpt", "value": "thanks!"}]},
    {"id": "c", "messages": [{"role": "user", "content": "def add(a, b):"},
                             {"role": "assistant", "content": "return a + b"}]},
    {"id": "d", "messages": [{"role": "user", "content": "two plus two?"}, {"role": "assistant", "content": "four"},
                             {"role": "user", "content": "thanks!"}, {"role": "assistant", "content": "hello"}]},
    {"id": "bad", "messages": [{"role": "tool", "content": "x"}, {"role": "assistant", "content": "y"}]},
]
TRAIN = ["--config", "configs/drafters/eagle3.yaml", "batch_size=2", "max_len=96", "eval_num_prompts=0",
         "warmup_steps=1", "ttt_steps=2", "log_every=1", "ckpt_every=2", "eval_every=0"]


@pytest.fixture(scope="module")
def chat_target(tmp_path_factory):
    tok = chat_tokenizer()
    cfg = sbj.models.config.tiny(vocab_size=len(tok), eos_token_ids=(tok.convert_tokens_to_ids("<|im_end|>"),))
    path = tmp_path_factory.mktemp("chat_target")
    sbj.save_target(sbj.init_target(cfg, seed=3, tokenizer=tok), path)
    return path


@pytest.mark.slow
def test_regenerate_train_export_and_finetune_a_chat_drafter(chat_target, tmp_path, capsys):
    convs = tmp_path / "chats.jsonl"
    convs.write_text("".join(json.dumps(c) + "\n" for c in CONVERSATIONS))
    regen = tmp_path / "regen"
    regenerate.main(["--target", str(chat_target), "--conversations", str(convs), "--out", str(regen),
                     "--thinking", "off", "--max-new-tokens", "6", "--modes", "greedy", "--batch-size", "4"])
    target = sbj.load_target(chat_target)
    tok, fmt = chat.chat_tokenizer(target.tokenizer), chat.ChatFormat(enable_thinking=False)
    recs = {r["id"]: r for r in map(json.loads, (regen / "greedy.jsonl").read_text().splitlines())}
    assert sorted(recs) == ["a", "b", "c", "d"]
    originals = {c.id: c.messages for c in chat.read_conversations(convs)[0]}
    for cid, rec in recs.items():  # the template is kept: records are the regenerated conversation rendered
        ids, mask = chat.render(tok, rec["messages"], fmt)
        assert rec["prompt_ids"] + rec["response_ids"] == ids.tolist() and rec["assistant_mask"] == mask.tolist()
        orig = originals[cid]
        assert [m["role"] for m in rec["messages"]] == [m["role"] for m in orig]
        assert [m for m in rec["messages"] if m["role"] != "assistant"] == [m for m in orig if m["role"] != "assistant"]
    # each assistant turn is the target's own greedy reply to the conversation so far
    msgs = recs["d"]["messages"]
    for k in (1, 3):
        prompt = chat.generation_prompt(tok, msgs[:k], fmt)
        assert prompt[-6:] == tok("<|im_start|>assistant\n<think>\n\n</think>\n\n", add_special_tokens=False)["input_ids"][-6:]
        out = sbj.generate(target, [prompt], max_new_tokens=6)[0].token_ids
        out = out[:-1] if out and out[-1] in target.config.eos_token_ids else out
        assert msgs[k]["content"] == tok.decode(out, skip_special_tokens=False)
    recorded = json.loads((regen / "settings.json").read_text())["chat"]
    assert recorded == fmt.record(tok) and recorded["enable_thinking"] is False

    common = [f"target_dir={chat_target}", f"regen_dir={regen}", f"tfds_dir={tmp_path / 'tfds'}"]
    run = lambda kind, name, *kw: cli.main([kind, *TRAIN, *common, f"run_dir={tmp_path / name}",  # noqa: E731
                                            f"out_dir={tmp_path / name / 'export'}", *kw])
    run("eagle3", "run", "max_steps=2", "draft_vocab_size=64")
    out = tmp_path / "run" / "export"
    assert json.loads((out / "config.json").read_text())["chat"] == recorded
    with pytest.raises(ValueError, match="chat format mismatch in enable_thinking"):
        sbj.load_drafter(out, target, chat=chat.ChatFormat(enable_thinking=True).record(tok))
    drafter, params = sbj.load_drafter(out, target, chat=recorded)

    # served here: conversation records in the chat format, the drafter's recorded format checked
    ask = tmp_path / "ask.jsonl"
    ask.write_text(json.dumps({"id": "q", "messages": [{"role": "user", "content": "hello world"}]}) + "\n")
    decode.main(["--prompts", str(ask), "--out", str(tmp_path / "ans.jsonl"), "--target", str(chat_target),
                 "--method", str(out), "--thinking", "off", "--max-new-tokens", "6"])
    answer = json.loads((tmp_path / "ans.jsonl").read_text())
    prompt = chat.generation_prompt(tok, [{"role": "user", "content": "hello world"}], fmt)
    assert answer["token_ids"] == sbj.generate(target, [prompt], max_new_tokens=6)[0].token_ids
    with pytest.raises(SystemExit) as exit_:
        decode.main(["--prompts", str(ask), "--out", str(tmp_path / "no.jsonl"), "--target", str(chat_target),
                     "--method", str(out), "--thinking", "on"])
    assert exit_.value.code == 2 and "chat format mismatch in enable_thinking" in capsys.readouterr().err

    sbj.save_drafter(drafter, params, tmp_path / "spec", dtype="float32", format="speculators",
                     max_positions=target.config.max_position_embeddings, chat=recorded)
    run("eagle3", "tune", "max_steps=1", "lr=1e-9", f"init_from={tmp_path / 'spec'}")
    tuned, tuned_params = sbj.load_drafter(tmp_path / "tune" / "export", target)
    _, imported = sbj.load_drafter(tmp_path / "spec", target)  # its draft ids reordered by target id
    assert tuned.config == drafter.config
    assert sorted(np.asarray(imported["d2t"]).tolist()) == sorted(np.asarray(params["d2t"]).tolist())
    np.testing.assert_array_equal(np.asarray(tuned_params["d2t"]), np.asarray(imported["d2t"]))
    a, b = flatten_params(imported["draft"]), flatten_params(tuned_params["draft"])
    for name in a:  # lr ~ 0: the fine-tuned drafter is the imported one (up to the bf16 export)
        np.testing.assert_allclose(np.asarray(b[name]), np.asarray(a[name]), rtol=1e-2, atol=1e-3, err_msg=name)
    with pytest.raises(ValueError, match="a eagle3 drafter, not dflash"):
        cli.main(["dflash", "--config", "configs/drafters/dflash.yaml", *common, f"run_dir={tmp_path / 'x'}",
                  f"out_dir={tmp_path / 'x'}", f"init_from={tmp_path / 'spec'}", "eval_num_prompts=0"])
