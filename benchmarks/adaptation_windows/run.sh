#!/bin/sh
# Serving-time adaptation and auto serving under a domain shift on target v2: window prompts (cut
# anywhere in held-out corpus files; the drafters trained on signature + docstring prompts), 128 new
# tokens, plain, adapted and auto variants of EAGLE-3, SpecBlock and DFlash beside target-only,
# methods interleaved over 4 rounds. SpecBlock adapts on 64-position crops (train_window=64).
# 1. T = 0, batch 1: prompts 0-159 (a 20,480-token job per method);
# 2. T = 1, batch 1: prompts 0-159 (~17,600 tokens per method: sampling stops some requests early);
# 3. batch 4, T = 0 and 1: prompts 0-79 (~10,000 tokens per method and group).
# The three ran as separate jobs, each alone on the machine, from the repository root:
# sh benchmarks/adaptation_windows/run.sh. Results go to outputs/benchmarks/adaptation_windows/.
OUT=outputs/benchmarks/adaptation_windows
E=assets/drafters/eagle3; S=assets/drafters/specblock; D=assets/drafters/dflash
M=ar,$E,$E:adapt=true,auto:$E,$S,$S:adapt.train_window=64,auto:$S,$D,$D:adapt=true,auto:$D
run() { .venv/bin/specblock-bench --target assets/target --prompts assets/prompts/windows.jsonl \
  --rounds 4 --max-new-tokens 128 --methods $M "$@"; }
set -e
run --limit 160 --temperatures 0 --batch-size 1 --out-dir $OUT/T0_b1
run --limit 160 --temperatures 1 --batch-size 1 --out-dir $OUT/T1_b1
run --limit 80 --temperatures 0,1 --batch-size 4 --out-dir $OUT/b4
