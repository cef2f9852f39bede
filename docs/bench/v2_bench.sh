#!/bin/sh
# Issue 16's benchmark on target v2: target-only, prompt lookup and EAGLE-3 (2,048-token draft
# vocabulary) at its shipped tree (16 nodes, depth 5) and, on the held-out set, at the tree
# `calibrate` picks per (temperature, batch) on this machine; held-out and HumanEval prompts, T=0
# and T=1, batch 1 and 8, 128 new tokens, the first $LIMIT prompts of each set. Run from the
# repository root on an otherwise idle machine (no training, no tests).
LIMIT=${LIMIT:-40}
E=assets/drafters-v2/eagle3
B="--target assets/target-v2 --temperatures 0,1 --batch-size 1,8 --max-new-tokens 128 --limit $LIMIT"
.venv/bin/specblock-bench $B --prompts assets/prompts/heldout.jsonl --out-dir docs/bench/v2_heldout \
  --methods ar,prompt_lookup,$E,$E:calibrate=true --calibrate-grid num_nodes=6,10,16 --calibrate-grid depth=3,5
.venv/bin/specblock-bench $B --prompts assets/prompts/humaneval.jsonl --out-dir docs/bench/v2_humaneval \
  --methods ar,prompt_lookup,$E
