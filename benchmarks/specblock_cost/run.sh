#!/bin/sh
# Issue 57 item 6: SpecBlock (the shipped, data-matched drafter) against EAGLE-3 at its shipped tree,
# at the paper's (preset=paper) and at its best trees from grid.sh + grid_price.py (EXTRA: the
# picks, e.g. ",assets/drafters/eagle3:depth=4:top_k=4:num_nodes=12"), on held-out (32), HumanEval
# (24) and the sympy windows (32): T = 0 and 1, batch 1 and 8, 128 new tokens, 3 interleaved
# rounds, priced for v5p:2x2x1 at Qwen3-8B shapes (estimates; SpecBlock's update by the run's mix
# of row buckets). Run on an otherwise idle machine (CPU columns); PRICE= (empty) leaves the priced
# columns out.   sh benchmarks/specblock_cost/run.sh
set -e
BENCH=${BENCH:-.venv/bin/specblock-bench}
OUT=${OUT:-outputs/benchmarks/specblock_cost}
CACHE=${CACHE:-outputs/price_cache}
PRICE=${PRICE---price v5p:2x2x1,qwen3-8b --price-cache $CACHE}
E=assets/drafters/eagle3; S=assets/drafters/specblock
M=${METHODS:-ar,$E,$E:preset=paper,$S}$EXTRA
B="--target assets/target --max-new-tokens 128 --rounds 3 --temperatures ${TEMPS:-0,1} --batch-size ${BATCHES:-1,8} \
  $PRICE --methods $M"
$BENCH $B --limit 32 --prompts assets/prompts/heldout.jsonl --out-dir $OUT/heldout
$BENCH $B --limit 24 --prompts assets/prompts/humaneval.jsonl --out-dir $OUT/humaneval
$BENCH $B --limit 32 --prompts assets/prompts/shift_sympy.jsonl --out-dir $OUT/unseen_sympy
