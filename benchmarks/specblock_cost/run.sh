#!/bin/sh
# Issue 57, SpecBlock's drafting cost fairly priced: the study's one entry (results.md). Stages, in
# order (STAGES narrows them; each writes what results.md quotes):
#   phases   items 1-3: every phase priced for v5p:2x2x1 at Qwen3-8B shapes -> after.json (before.json
#            is the same script at 265ea4e: results.md)
#   grid     item 4(b): each drafter's trees on 24 training prompts (CPU, idle machine), then priced
#            -> grid.json
#   compare  item 6: three sets, T 0/1, batch 1/8 (bench.sh), then compare.json and priced.json
#   context  the update's priced bytes against the context -> context_bytes.json
set -e
HERE=benchmarks/specblock_cost
PY=${PY:-.venv/bin/python}
BENCH=${BENCH:-.venv/bin/specblock-bench}
OUT=${OUT:-outputs/benchmarks/specblock_cost}
E=assets/drafters/eagle3; S=assets/drafters/specblock
for stage in ${STAGES:-phases grid compare context}; do
  case $stage in
    phases) $PY $HERE/phases.py --out $HERE/after.json;;
    grid)
      EG=$E:depth=3:top_k=4:num_nodes=8,$E:depth=4:top_k=4:num_nodes=12,$E,$E:depth=5:top_k=8:num_nodes=16
      EG=$EG,$E:depth=6:top_k=6:num_nodes=24,$E:depth=4:top_k=8:num_nodes=32,$E:depth=6:top_k=8:num_nodes=32
      EG=$EG,$E:preset=paper
      SG=$S:num_nodes=8,$S,$S:num_nodes=24,$S:num_nodes=32,$S:max_blocks=3,$S:num_nodes=32:max_blocks=3
      $BENCH --target assets/target --prompts assets/prompts/train.jsonl --skip 2000 --limit 24 --rounds 2 \
        --max-new-tokens 128 --temperatures 0 --batch-size 1 --out-dir $OUT/grid --methods ar,$EG,$SG
      $PY $HERE/grid_price.py;;
    compare)
      OUT=$OUT TEMPS=0 BATCHES=1 PRICE= TAG=_T0_b1 EXTRA=,$E:depth=3:top_k=4:num_nodes=8,$S:num_nodes=8 sh $HERE/bench.sh
      OUT=$OUT TEMPS=1 BATCHES=1 PRICE= TAG=_T1_b1 sh $HERE/bench.sh
      OUT=$OUT TEMPS=0,1 BATCHES=8 PRICE= TAG=_T01_b8 sh $HERE/bench.sh
      OUT=$OUT TEMPS=0 BATCHES=1 PRICE= TAG=_T0_b1_sbpick METHODS=ar,$S:num_nodes=32:max_blocks=3,$S:max_blocks=3 \
        sh $HERE/bench.sh
      $PY $HERE/compare.py
      $PY $HERE/priced.py;;
    context) $PY $HERE/context_bytes.py;;
    *) echo "unknown stage $stage (phases, grid, compare, context)" >&2; exit 2;;
  esac
done
