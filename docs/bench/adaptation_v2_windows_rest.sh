#!/bin/sh
# Issue 19's remaining domain-shift rows: the window prompts of docs/bench/adaptation_v2.sh (prompts
# 0-159, 128 new tokens: a 20,480-token job per method and group) at T = 1, batch 1, and at batch 4
# (T = 0 and 1), with the same methods and settings as its T = 0, batch 1 run
# (docs/bench/adaptation_v2_windows). Run alone, from the repository root.
E=assets/drafters/eagle3; S=assets/drafters/specblock; D=assets/drafters/dflash
M=ar,$E,$E:adapt=true,auto:$E,$S,$S:adapt.train_window=64,auto:$S,$D,$D:adapt=true,auto:$D
run() { .venv/bin/specblock-bench --target assets/target --prompts assets/prompts/windows.jsonl --limit 160 \
  --rounds 4 --max-new-tokens 128 --methods $M "$@"; }
run --temperatures 1 --batch-size 1 --out-dir docs/bench/adaptation_v2_windows_T1
run --temperatures 0,1 --batch-size 4 --out-dir docs/bench/adaptation_v2_windows_b4
