#!/bin/sh
# Issue 57 item 4(b), the measured half: each drafter's tree knobs over a grid, on prompts outside
# the evaluation sets (24 training prompts, train.jsonl records 2000-2023), T = 0, batch 1, 128 new
# tokens, 2 interleaved rounds, on an otherwise idle machine: tau (independent of load), drafter
# commit counts (for pricing SpecBlock's row-switched update) and CPU speed (the CPU pick).
# EAGLE-3 (depth, top-k, nodes): (3,4,8) (4,4,12) (5,4,16 = shipped) (5,8,16) (6,6,24) (4,8,32)
# (6,8,32) (8,10,61 = preset=paper); SpecBlock (nodes, blocks): 8, 16 (shipped), 24, 32 at 2
# blocks, 16 and 32 at 3. The priced half: grid_price.py.
set -e
BENCH=${BENCH:-.venv/bin/specblock-bench}
OUT=${OUT:-outputs/benchmarks/specblock_cost/grid}
E=assets/drafters/eagle3; S=assets/drafters/specblock
EG=$E:depth=3:top_k=4:num_nodes=8,$E:depth=4:top_k=4:num_nodes=12,$E,$E:depth=5:top_k=8:num_nodes=16
EG=$EG,$E:depth=6:top_k=6:num_nodes=24,$E:depth=4:top_k=8:num_nodes=32,$E:depth=6:top_k=8:num_nodes=32
EG=$EG,$E:preset=paper
SG=$S:num_nodes=8,$S,$S:num_nodes=24,$S:num_nodes=32,$S:max_blocks=3,$S:num_nodes=32:max_blocks=3
$BENCH --target assets/target --prompts assets/prompts/train.jsonl --skip 2000 --limit 24 --rounds 2 \
  --max-new-tokens 128 --temperatures 0 --batch-size 1 --out-dir $OUT --methods ar,$EG,$SG
