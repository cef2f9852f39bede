#!/usr/bin/env bash
# DFlash trees against the chain (issue 67): pooled tau of the shipped DFlash drafter (assets/drafters/dflash,
# block 8) as today's chain and as best-first trees of 8, 16, 32 and 64 nodes, on three prompt sets at T = 0
# and T = 1, then table.py pools the runs into results.md's table and a compact results.json. Tau is
# deterministic per prompt (T = 0) or per seed (T = 1), so one round (--rounds 1) at batch 8 serves; the
# speeds specblock-bench also writes are not a measurement here (the machine was shared). Every method is
# ':sizing=fixed': each step verifies the whole tree of its size (step sizing would prune it).
#   bash benchmarks/dflash_tree/run.sh [OUT_DIR]    (default /tmp/dflash_tree)
# Environment: SETS (default "heldout humaneval shift_sympy"), LIMIT (prompts of held-out, default 32),
# OTHER_LIMIT (prompts of the other sets, default 16), MAX_NEW (default 128).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-/tmp/dflash_tree}
D=assets/drafters/dflash:sizing=fixed
TREES="$D:num_nodes=8:candidates=7,$D:num_nodes=16,$D:num_nodes=32,$D:num_nodes=64"
GREEDY_TREES="$D:num_nodes=8:candidates=7:draft_mode=greedy,$D:num_nodes=16:draft_mode=greedy"
GREEDY_TREES="$GREEDY_TREES,$D:num_nodes=32:draft_mode=greedy,$D:num_nodes=64:draft_mode=greedy"
for set in ${SETS:-heldout humaneval shift_sympy}; do
  limit=${OTHER_LIMIT:-16}
  [ "$set" = heldout ] && limit=${LIMIT:-32}
  for t in 0 1; do
    # T = 0: the drafter's saved mode ("auto") never samples. T = 1: "auto" rows switch to the sampled
    # chain once they commit a non-argmax token, so the trees run with deterministic drafts
    # (draft_mode=greedy); held-out also runs the 32-node tree in "auto".
    methods="$D,$TREES"
    if [ "$t" = 1 ]; then
      methods="$D,$GREEDY_TREES"
      [ "$set" = heldout ] && methods="$D,$D:num_nodes=32,$GREEDY_TREES"
    fi
    .venv/bin/specblock-bench --prompts "assets/prompts/$set.jsonl" --methods "$methods" --temperatures "$t" \
      --batch-size 8 --limit "$limit" --max-new-tokens "${MAX_NEW:-128}" --rounds 1 --warmup-prompts 0 \
      --out-dir "$OUT/${set}_T$t"
  done
done
.venv/bin/python benchmarks/dflash_tree/table.py "$OUT"
