#!/bin/sh
# Issue 58, BlockPilot in the window 6-10: the study's one entry (results.md). Stages (STAGES narrows
# them): labels (below), price (price_sizes.py: each size's DFlash step priced for v5p ->
# costs_v5p.json), evaluate (evaluate.py: the two policies against fixed sizes -> results_6-10.json;
# EXPORT=DIR also saves the policies).
# Stage labels, issue 58 item 3: per-request tau tables for BlockPilot's labels around the shipped DFlash's training
# block B = 8: sizes 6..10 (B-2..B+2, the window) first, then 11 and 12 (phase 0 found tau
# still rising at 10). Greedy (T = 0), 128 new tokens, batches of 16 (greedy rows are independent
# of their batch: each row's tau is its batch-1 tau). Splits: 192 training prompts (train.jsonl
# 1400-1591, as the retired blockpilot_priced), 128 held-out (heldout.jsonl 0-127), 64 HumanEval.
# Resumes: rerun the same command after a kill. Tau does not depend on the machine's load, so this
# may run beside other work. Tables: labels/<split>/size_<s>.jsonl {"id", "tau", "forwards", "new_tokens"}.
set -e
PY=${PY:-.venv/bin/python}
TRAIN=${TRAIN:-.venv/bin/specblock-train}
H=benchmarks/blockpilot_window
L=benchmarks/blockpilot_window/labels
run() {  # split prompts skip limit sizes
  $TRAIN blockpilot labels --dflash assets/drafters/dflash --prompts assets/prompts/$2 --skip $3 \
    --limit $4 --sizes $5 --max-new-tokens 128 --batch-size 16 --cost-prompts 0 --out $L/$1
}
for stage in ${STAGES:-labels price evaluate}; do
  case $stage in
    labels)
      for sizes in ${SIZES:-6,7,8,9,10 11,12}; do
        run train train.jsonl 1400 192 $sizes
        run heldout heldout.jsonl 0 128 $sizes
        run humaneval humaneval.jsonl 0 64 $sizes
      done;;
    price) $PY $H/price_sizes.py --sizes 6,7,8,9,10;;
    evaluate) $PY $H/evaluate.py --window 6,10 --out $H/results_6-10.json ${EXPORT:+--export $EXPORT};;
    *) echo "unknown stage $stage (labels, price, evaluate)" >&2; exit 2;;
  esac
done
