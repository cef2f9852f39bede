#!/bin/sh
# Serving-time adaptation and auto serving in domain on target v2: held-out signature prompts 0-63,
# 128 new tokens (8,192 tokens per method and group), methods interleaved over 4 rounds. Each command
# ran as its own job, alone on the machine, from the repository root:
# sh benchmarks/adaptation_indomain/run.sh. Results go to outputs/benchmarks/adaptation_indomain/.
OUT=outputs/benchmarks/adaptation_indomain
E=assets/drafters/eagle3; S=assets/drafters/specblock; D=assets/drafters/dflash
run() { .venv/bin/specblock-bench --target assets/target --prompts assets/prompts/heldout.jsonl --limit 64 \
  --rounds 4 --max-new-tokens 128 "$@"; }
set -e
# 1. EAGLE-3 plain and adapted, and every drafter plain and under auto: T=0 and T=1 at batch 1,
#    then batch 4 at both temperatures.
M=ar,$E,$E:adapt=true,auto:$E,$S,auto:$S,$D,auto:$D
run --methods $M --temperatures 0 --batch-size 1 --out-dir $OUT/T0_b1
run --methods $M --temperatures 1 --batch-size 1 --out-dir $OUT/T1_b1
run --methods $M --temperatures 0,1 --batch-size 4 --out-dir $OUT/b4
# 2. SpecBlock (adapting on 64-position crops) and DFlash, plain and adapted, at batch 1 and 4.
M=ar,$S,$S:adapt.train_window=64,$D,$D:adapt=true
run --methods $M --temperatures 0,1 --batch-size 1 --out-dir $OUT/specblock_dflash_b1
run --methods $M --temperatures 0,1 --batch-size 4 --out-dir $OUT/specblock_dflash_b4
# 3. What collecting costs: an adapter that never updates (cost_scale=inf) decodes the plain
#    drafter's tokens and only collects the target's features.
run --methods ar,$E,$E:adapt.cost_scale=inf --temperatures 0 --batch-size 1 --out-dir $OUT/collect_only
