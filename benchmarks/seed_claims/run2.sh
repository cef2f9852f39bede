#!/bin/sh
# Issue 40, the comparison's remaining cells (2026-12-05): every (T, batch) group on the three prompt
# sets with the data-matched SpecBlock retrained with prefix_norm=all (assets/drafters/specblock-data)
# and DFlash block 8 trained on to the stopping rule (configs/drafters/dflash-v2-plateau.yaml, copied
# to assets/drafters/dflash-plateau in the checkout that runs this). Held-out: also the shipped
# DFlash 8 and BlockPilot with v5p-priced labels (its policy was trained on the shipped DFlash's
# labels). Settings as run.sh: 128 new tokens, 3 interleaved rounds, T = 0 and 1, batch 1 and 8,
# priced for v5p:2x2x1 at Qwen3-8B shapes from outputs/price_cache (filled by the --price-only step,
# which can run beside other work). Run on an otherwise idle machine: sh benchmarks/seed_claims/run2.sh
set -e
BENCH=${BENCH:-.venv/bin/specblock-bench}
OUT=${OUT:-outputs/benchmarks/seed_claims2}
CACHE=${CACHE:-outputs/price_cache}
LIMIT=${LIMIT:-32}
HE_LIMIT=${HE_LIMIT:-24}
E=assets/drafters/eagle3
S=assets/drafters/specblock-data
D=assets/drafters/dflash
DP=assets/drafters/dflash-plateau
P5=assets/drafters/blockpilot-v5p
M="ar,prompt_lookup,$E,$S,$DP"
B="--target assets/target --max-new-tokens 128 --rounds 3 --temperatures 0,1 --batch-size 1,8 \
  --price v5p:2x2x1,qwen3-8b --price-cache $CACHE"
test -f "$DP/config.json" || { echo "no DFlash export at $DP (configs/drafters/dflash-v2-plateau.yaml)" >&2; exit 1; }
$BENCH $B --price-only --prompts assets/prompts/heldout.jsonl --out-dir $OUT/price \
  --methods $M,$DP:block_size=4,$D,$P5
$BENCH $B --limit $LIMIT --prompts assets/prompts/heldout.jsonl --out-dir $OUT/heldout \
  --methods $M,$DP:block_size=4,$D,$P5
$BENCH $B --limit $HE_LIMIT --prompts assets/prompts/humaneval.jsonl --out-dir $OUT/humaneval --methods $M
$BENCH $B --limit $LIMIT --prompts assets/prompts/shift_sympy.jsonl --out-dir $OUT/unseen_sympy --methods $M
