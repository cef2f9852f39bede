#!/bin/sh
# Issue 19's missing in-domain rows: plain and adapted SpecBlock and DFlash on held-out signature
# prompts 0-63 (8,192 tokens per method and group), T = 0 and 1 at batch 1, and batch 4, beside
# target-only; the settings of docs/bench/adaptation_v2.sh (SpecBlock adapts on 64-position crops).
# EAGLE-3's in-domain rows are in docs/bench/adaptation_v2_heldout*. Run alone, from the repository root.
S=assets/drafters/specblock; D=assets/drafters/dflash
M=ar,$S,$S:adapt.train_window=64,$D,$D:adapt=true
run() { .venv/bin/specblock-bench --target assets/target --prompts assets/prompts/heldout.jsonl --limit 64 \
  --rounds 4 --max-new-tokens 128 --methods $M "$@"; }
run --temperatures 0,1 --batch-size 1 --out-dir docs/bench/adaptation_v2_indomain_b1
run --temperatures 0,1 --batch-size 4 --out-dir docs/bench/adaptation_v2_indomain_b4
