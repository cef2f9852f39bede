#!/bin/sh
# The benchmark on target v2 (issues 16, 17, 18): target-only, prompt lookup, EAGLE-3 (2,048-token
# draft vocabulary), SpecBlock (3 training blocks, the same draft vocabulary) and DFlash (trained
# at block 8), each drafter at its shipped setting and, on the held-out set, at the setting
# `calibrate` picks per (temperature, batch) on this machine; held-out and HumanEval prompts, T=0
# and T=1, batch 1 and 8, 128 new tokens, the first $LIMIT prompts of each set. Then SpecBlock's
# accelerator-scale tree (slot-0 beam 10, 90 nodes, as the reference's "1,2,10,90") on held-out
# prompts at T=0, batch 1, for tau and drafter forwards per token.
# Run from the repository root on an otherwise idle machine (no training, no tests).
LIMIT=${LIMIT:-40}
E=assets/drafters-v2/eagle3
S=assets/drafters-v2/specblock
D=assets/drafters-v2/dflash
B="--target assets/target-v2 --max-new-tokens 128"
G="--calibrate-grid num_nodes=6,10,16 --calibrate-grid depth=3,5 --calibrate-grid max_blocks=2,3 --calibrate-grid block_size=4,6,8"
set -e
.venv/bin/specblock-bench $B --temperatures 0,1 --batch-size 1,8 --limit $LIMIT $G \
  --prompts assets/prompts/heldout.jsonl --out-dir docs/bench/v2_heldout \
  --methods ar,prompt_lookup,$E,$E:calibrate=true,$S,$S:calibrate=true,$D,$D:calibrate=true
.venv/bin/specblock-bench $B --temperatures 0,1 --batch-size 1,8 --limit $LIMIT \
  --prompts assets/prompts/humaneval.jsonl --out-dir docs/bench/v2_humaneval \
  --methods ar,prompt_lookup,$E,$S,$D
.venv/bin/specblock-bench $B --temperatures 0 --batch-size 1 --limit 16 \
  --prompts assets/prompts/heldout.jsonl --out-dir docs/bench/v2_specblock_wide \
  --methods ar,$E,$S,$S:beam=10:num_nodes=90:max_blocks=2
