#!/bin/sh
# BlockPilot with labels priced for v5p (issue 40 item 4). Steps 1-4 reproduce the committed files
# (step 1 is the long one: ~5 x 544 greedy decodes; resumable); step 5 is the MEASURED CPU bench,
# to run on an otherwise idle machine (no training, no tests). From the repository root:
#   sh benchmarks/blockpilot_priced/run.sh            # steps 1-4
#   BENCH=1 sh benchmarks/blockpilot_priced/run.sh    # and the bench
# tau.json was measured with the DFlash drafter shipped until 2026-12-05, which step 1 reads from
# runs/dflash/dflash-v2/export (specblock-train dflash --config configs/drafters/dflash-v2.yaml);
# step 5's assets/drafters/dflash is now the drafter trained on to the stopping rule.
set -e
B=benchmarks/blockpilot_priced
# 1. per-request tau at sizes 4-8 (train 1400-1719, held-out 0-199, HumanEval 0-23) -> $B/tau.json
sh $B/labels.sh
# 2. the priced step costs (needs benchmarks/tpu_aot/results.json's rows) -> $B/costs_v5p.json
.venv/bin/python $B/costs.py
# 3. label folders from the committed table (costs.json = the priced costs), then the policy
.venv/bin/python $B/tau_table.py restore
.venv/bin/specblock-train blockpilot train --config configs/drafters/blockpilot-v5p.yaml
# 4. priced comparison, label counts and the scatter -> $B/results.md, results.json, scatter.png
.venv/bin/python $B/compare.py
[ -n "$BENCH" ] || exit 0
# 5. measured on this CPU (and priced by the bench): target-only, DFlash at each size 4-8, the
# policy, and the per-request oracle of the priced labels (`:oracle=` reads each label folder's
# costs.json, the priced one after step 3); 128 new tokens, T = 0 and 1, batch 1 and 8, 3 rounds.
D=assets/drafters/dflash
P=assets/drafters/blockpilot-v5p
L=data/blockpilot-v5p
OUT=outputs/benchmarks/blockpilot_priced
ARGS="--target assets/target --max-new-tokens 128 --rounds 3 --temperatures 0,1 --batch-size 1,8 --price v5p:2x2x1,qwen3-8b --price-cache outputs/price_cache"
M="ar,$D:block_size=4,$D:block_size=5,$D:block_size=6,$D:block_size=7,$D:block_size=8,$P"
.venv/bin/specblock-bench $ARGS --limit 32 --prompts assets/prompts/heldout.jsonl \
  --out-dir $OUT/heldout --methods $M,$P:oracle=$L/heldout
.venv/bin/specblock-bench $ARGS --limit 24 --prompts assets/prompts/humaneval.jsonl \
  --out-dir $OUT/humaneval --methods $M,$P:oracle=$L/humaneval
