#!/bin/sh
# Issue 57 item 4(b): each drafter's tree chosen per hardware on prompts outside the evaluation sets
# (24 training prompts, train.jsonl 2000-2023), T = 0, batch 1, 128 new tokens: tau measured here,
# steps priced for v5p:2x2x1 at Qwen3-8B shapes (estimates; SpecBlock's update by the run's mix of
# row buckets), CPU speedup measured in the same run (one round: noisy). EAGLE-3: the shipped tree
# (depth 5, top-k 4, 16 nodes), the paper's (preset=paper: 8 levels, top-k 10, 61 nodes) and a
# middle one (depth 4, top-k 8, 32 nodes); SpecBlock: its shipped 16-node tree and 32 nodes.
set -e
BENCH=${BENCH:-.venv/bin/specblock-bench}
OUT=${OUT:-outputs/benchmarks/specblock_cost/grid}
CACHE=${CACHE:-outputs/price_cache}
E=assets/drafters/eagle3; S=assets/drafters/specblock
$BENCH --target assets/target --prompts assets/prompts/train.jsonl --skip 2000 --limit 24 --rounds 1 \
  --max-new-tokens 128 --temperatures 0 --batch-size 1 --price v5p:2x2x1,qwen3-8b --price-cache $CACHE \
  --out-dir $OUT --methods ar,$E,$E:preset=paper,$E:depth=4:top_k=8:num_nodes=32,$S,$S:num_nodes=32
