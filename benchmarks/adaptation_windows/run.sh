#!/bin/sh
# Issue 19's remaining domain-shift rows: the window prompts of docs/bench/adaptation_v2.sh with the
# same methods and settings as its T = 0, batch 1 run (docs/bench/adaptation_v2_windows), run alone
# from the repository root, one command after the other:
# 1. T = 1, batch 1: prompts 0-159, 128 new tokens (a ~17,600-token job per method; session 15);
# 2. batch 4, T = 0 and 1: prompts 0-79 (a ~10,000-token job per method and group: the session had no
#    time left for 160), with the adapter's keep_z rule (session 15) in force, which the other
#    adaptation rows predate.
E=assets/drafters/eagle3; S=assets/drafters/specblock; D=assets/drafters/dflash
M=ar,$E,$E:adapt=true,auto:$E,$S,$S:adapt.train_window=64,auto:$S,$D,$D:adapt=true,auto:$D
run() { .venv/bin/specblock-bench --target assets/target --prompts assets/prompts/windows.jsonl \
  --rounds 4 --max-new-tokens 128 --methods $M "$@"; }
run --limit 160 --temperatures 1 --batch-size 1 --out-dir docs/bench/adaptation_v2_windows_T1
run --limit 80 --temperatures 0,1 --batch-size 4 --out-dir docs/bench/adaptation_v2_windows_b4
