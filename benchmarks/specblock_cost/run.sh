#!/bin/sh
# Issue 57 item 6, the part this session ran: SpecBlock (the shipped, data-matched drafter) against
# EAGLE-3 at its shipped tree and at the paper's (preset=paper) on held-out (32), HumanEval (24) and
# the sympy windows (32): T = 0, batch 1, 128 new tokens, 3 interleaved rounds; priced for v5p:2x2x1
# at Qwen3-8B shapes (estimates; SpecBlock's update by the run's mix of row buckets). Run on an
# otherwise idle machine for the CPU columns:  sh benchmarks/specblock_cost/run.sh
set -e
BENCH=${BENCH:-.venv/bin/specblock-bench}
OUT=${OUT:-outputs/benchmarks/specblock_cost}
CACHE=${CACHE:-outputs/price_cache}
E=assets/drafters/eagle3; S=assets/drafters/specblock
M=${METHODS:-ar,$E,$E:preset=paper,$S}
B="--target assets/target --max-new-tokens 128 --rounds 3 --temperatures 0 --batch-size 1 \
  --price v5p:2x2x1,qwen3-8b --price-cache $CACHE --methods $M"
$BENCH $B --limit 32 --prompts assets/prompts/heldout.jsonl --out-dir $OUT/heldout
$BENCH $B --limit 24 --prompts assets/prompts/humaneval.jsonl --out-dir $OUT/humaneval
$BENCH $B --limit 32 --prompts assets/prompts/shift_sympy.jsonl --out-dir $OUT/unseen_sympy
