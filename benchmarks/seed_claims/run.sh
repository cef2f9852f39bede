#!/bin/sh
# Issue 40 item 5, the seeds' claims at the papers' protocol (the run of 2026-12-05, results.md): one
# comparison, measured on this CPU and priced for v5p:2x2x1 at Qwen3-8B shapes. Every (T, batch) group
# (T = 0 and 1, batch 1 and 8; 128 new tokens, 3 interleaved rounds) on three prompt sets (held-out,
# HumanEval, the sympy windows) with target-only, prompt lookup, EAGLE-3, the data-matched SpecBlock
# trained with prefix_norm=all (assets/drafters/specblock-data) and DFlash block 8 trained on to the
# stopping rule (configs/drafters/dflash-v2-plateau.yaml; when this ran, exported to
# assets/drafters/dflash-plateau beside the earlier 1,248-step drafter at assets/drafters/dflash).
# Held-out: also that DFlash at block 4, the earlier DFlash 8 and BlockPilot with v5p-priced labels
# (its policy was trained on the earlier DFlash's labels). Priced steps come from $CACHE (filled by the
# --price-only step, which can run beside other work). Run on an otherwise idle machine:
#   sh benchmarks/seed_claims/run.sh      (then summary.py and t1_acceptance.py, below)
set -e
BENCH=${BENCH:-.venv/bin/specblock-bench}
OUT=${OUT:-outputs/benchmarks/seed_claims}
CACHE=${CACHE:-outputs/price_cache}
LIMIT=${LIMIT:-32}
HE_LIMIT=${HE_LIMIT:-24}
E=assets/drafters/eagle3
S=assets/drafters/specblock  # assets/drafters/specblock-data when this ran (renamed 2026-12-07)
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
# the tables of results.md, then the T = 1 acceptance ceiling it quotes (helpers, not run alone)
PY=${PY:-.venv/bin/python}
$PY benchmarks/seed_claims/summary.py $OUT
$PY benchmarks/seed_claims/t1_acceptance.py
