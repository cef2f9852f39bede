#!/bin/sh
# DFlash + BlockPilot on target v2: target-only, DFlash at every candidate block size (4, 6, 8;
# trained at 8), the per-request oracle (each request at the size its label measured fastest:
# `:oracle=LABELS`) and DFlash + BlockPilot (the policy picks each request's size after prefill;
# requests are grouped by size), on held-out and HumanEval prompts, T=0 and T=1, batch 1 and 8, 128
# new tokens, methods interleaved over 3 rounds of prompts (--rounds). The oracle's labels (greedy,
# 64 tokens; the same at T=1) are made first (resumable: skipped when done). Run from the
# repository root on an otherwise idle machine (no training, no tests): sh benchmarks/blockpilot/run.sh
LIMIT=${LIMIT:-32}
HE_LIMIT=${HE_LIMIT:-24}
OUT=outputs/benchmarks/blockpilot
D=assets/drafters/dflash
P=assets/drafters/blockpilot
L=data/blockpilot-v2
B="--target assets/target --max-new-tokens 128 --rounds 3 --temperatures 0,1 --batch-size 1,8"
set -e
.venv/bin/specblock-train blockpilot labels --config configs/drafters/blockpilot-v2.yaml \
  --prompts assets/prompts/heldout.jsonl --skip 0 --limit 200 --out $L/heldout
.venv/bin/specblock-train blockpilot labels --config configs/drafters/blockpilot-v2.yaml \
  --prompts assets/prompts/humaneval.jsonl --skip 0 --limit $HE_LIMIT --out $L/humaneval
M="ar,$D:block_size=4,$D:block_size=6,$D:block_size=8,$P"
.venv/bin/specblock-bench $B --limit $LIMIT --prompts assets/prompts/heldout.jsonl \
  --out-dir $OUT/heldout --methods $M,$P:oracle=$L/heldout
.venv/bin/specblock-bench $B --limit $HE_LIMIT --prompts assets/prompts/humaneval.jsonl \
  --out-dir $OUT/humaneval --methods $M,$P:oracle=$L/humaneval
