#!/bin/sh
# Issue 57 item 6: SpecBlock (the shipped, data-matched drafter) against EAGLE-3 at its shipped tree
# and at the paper's (preset=paper), plus EXTRA methods (the grid's picks, e.g.
# ",assets/drafters/eagle3:depth=3:top_k=4:num_nodes=8"), on held-out (32), HumanEval (24) and the
# sympy windows (32), 128 new tokens, 3 interleaved rounds, on an otherwise idle machine.
# TEMPS (default 0,1), BATCHES (default 1,8), SETS (default all three) narrow the run; PRICE= (empty)
# leaves the priced columns out (default: priced for v5p:2x2x1 at Qwen3-8B shapes, estimates).
# A helper of run.sh (the study's entry), which runs it with the settings results.md records.
set -e
BENCH=${BENCH:-.venv/bin/specblock-bench}
OUT=${OUT:-outputs/benchmarks/specblock_cost}
CACHE=${CACHE:-outputs/price_cache}
PRICE=${PRICE---price v5p:2x2x1,qwen3-8b --price-cache $CACHE}
E=assets/drafters/eagle3; S=assets/drafters/specblock
M=${METHODS:-ar,$E,$E:preset=paper,$S}$EXTRA
B="--target assets/target --max-new-tokens 128 --rounds 3 --temperatures ${TEMPS:-0,1} --batch-size ${BATCHES:-1,8} \
  $PRICE --methods $M"
for set in ${SETS:-heldout humaneval unseen_sympy}; do
  case $set in
    heldout) P="--limit 32 --prompts assets/prompts/heldout.jsonl";;
    humaneval) P="--limit 24 --prompts assets/prompts/humaneval.jsonl";;
    unseen_sympy) P="--limit 32 --prompts assets/prompts/shift_sympy.jsonl";;
  esac
  $BENCH $B $P --out-dir $OUT/$set${TAG}
done
