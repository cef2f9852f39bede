#!/usr/bin/env bash
# The conversation recipe of docs/serving_engines.md, every step that runs without an accelerator,
# on the embedded target with the plain chat template (configs/chat/plain.jinja):
#   regenerate the assistant turns -> train EAGLE-3 (a few steps) -> export for vLLM / SGLang ->
#   import back -> fine-tune from the export -> serve conversations here with the chat-format check.
# Usage: bash scripts/chat_recipe_tiny.sh [WORK_DIR]   (default /tmp/sbj-chat-recipe)
set -euo pipefail
W=${1:-/tmp/sbj-chat-recipe}
PY=${PYTHON:-.venv/bin/python}
BIN=$(dirname "$PY")   # the console scripts installed beside it
rm -rf "$W" && mkdir -p "$W"
set -x
$PY -m train.regenerate --target assets/target --conversations configs/chat/example_conversations.jsonl \
  --chat-template configs/chat/plain.jinja --out "$W/regen" --max-new-tokens 48 --modes greedy \
  --batch-size 4 --tfds-dir "$W/tfds"
$BIN/specblock-train eagle3 --config configs/drafters/eagle3.yaml target_dir=assets/target \
  regen_dir="$W/regen" tfds_dir="$W/tfds" run_dir="$W/run" out_dir="$W/eagle3" max_steps=4 \
  warmup_steps=1 batch_size=4 max_len=192 eval_num_prompts=0 eval_every=0 ckpt_every=2 log_every=1 \
  draft_vocab_size=2048
$BIN/specblock-export "$W/eagle3" "$W/eagle3-speculators" --format speculators --verifier assets/target
$BIN/specblock-export "$W/eagle3" "$W/eagle3-sglang" --format eagle3
$BIN/specblock-export "$W/eagle3-speculators" "$W/eagle3-back" --format specblock
$BIN/specblock-train eagle3 --config configs/drafters/eagle3.yaml target_dir=assets/target \
  regen_dir="$W/regen" tfds_dir="$W/tfds" run_dir="$W/tune" out_dir="$W/eagle3-tuned" max_steps=2 \
  warmup_steps=1 batch_size=4 max_len=192 eval_num_prompts=0 eval_every=0 ckpt_every=2 log_every=1 \
  init_from="$W/eagle3-speculators"
printf '%s\n' '{"id": "q1", "messages": [{"role": "user", "content": "Write a function that multiplies two numbers."}]}' \
  '{"id": "q2", "conversations": [{"from": "human", "value": "Return the last item of a list."}]}' > "$W/ask.jsonl"
$BIN/specblock-decode --prompts "$W/ask.jsonl" --out "$W/answers.jsonl" --chat-template configs/chat/plain.jinja \
  --method "$W/eagle3-speculators" --max-new-tokens 32
$BIN/specblock-decode --prompts "$W/ask.jsonl" --out "$W/refused.jsonl" --chat-template configs/chat/plain.jinja \
  --thinking off --method "$W/eagle3-speculators" --max-new-tokens 32 || echo "refused as expected (thinking flag differs)"
