#!/bin/sh
# Issue 19's bench on target v2: plain, adapted and auto variants of EAGLE-3, SpecBlock and DFlash.
# Run alone (nothing else on the machine), from the repository root: sh docs/bench/adaptation_v2.sh
# 1. Domain shift: window prompts 0-159 (cut anywhere in held-out files; the drafters trained on
#    signature + docstring prompts), T=0, batch 1, 128 new tokens: a 20,480-token job per method.
#    SpecBlock adapts on 64-position crops (train_window=64: its update round 19.0 -> 2.0 s).
E=assets/drafters/eagle3; S=assets/drafters/specblock; D=assets/drafters/dflash
.venv/bin/specblock-bench --target assets/target --prompts assets/prompts/windows.jsonl --limit 160 --rounds 4 \
  --temperatures 0 --batch-size 1 --max-new-tokens 128 \
  --methods ar,$E,$E:adapt=true,auto:$E,$S,$S:adapt.train_window=64,auto:$S,$D,$D:adapt=true,auto:$D \
  --out-dir docs/bench/adaptation_v2_windows
# 2. In domain: held-out signature prompts 0-63 (8,192 tokens per method and group), in three runs:
#    T=0 and batch 1; T=1 and batch 1; batch 4 at T=0 and 1. (The first ran as one 4-group run
#    that crashed in its second group, XLA:CPU out of code memory, before the bench released each
#    group's executables; its finished first group is docs/bench/adaptation_v2_heldout.)
M=ar,$E,$E:adapt=true,auto:$E,$S,auto:$S,$D,auto:$D
run() { .venv/bin/specblock-bench --target assets/target --prompts assets/prompts/heldout.jsonl --limit 64 \
  --rounds 4 --max-new-tokens 128 --methods $M "$@"; }
run --temperatures 0 --batch-size 1 --out-dir docs/bench/adaptation_v2_heldout
run --temperatures 1 --batch-size 1 --out-dir docs/bench/adaptation_v2_heldout_T1
run --temperatures 0,1 --batch-size 4 --out-dir docs/bench/adaptation_v2_heldout_b4
