#!/bin/sh
# Issue 19's `auto` on target v2 after session 11's changes (a warmed first run, larger trees than a
# losing one left unexplored, no re-check near the job's end), on longer jobs than
# docs/bench/adaptation_v2.sh: all 200 held-out prompts (25,600 tokens per method and group) and
# 160 window prompts (20,480). Plain SpecBlock is run once, beside its fixed-branching ablation
# (issue 17); adaptation is not rerun (unchanged since adaptation_v2.sh).
# Run alone (nothing else on the machine), from the repository root: sh docs/bench/auto_v2.sh
E=assets/drafters/eagle3; S=assets/drafters/specblock; D=assets/drafters/dflash
M=ar,$E,auto:$E,auto:$S,$D,auto:$D
bench() { .venv/bin/specblock-bench --target assets/target --rounds 4 --max-new-tokens 128 "$@"; }
H="--prompts assets/prompts/heldout.jsonl --limit 200"
bench $H --temperatures 0 --batch-size 1 --methods $M,$S,$S:rank_tree=false --out-dir docs/bench/auto_v2_heldout
bench $H --temperatures 1 --batch-size 1 --methods $M --out-dir docs/bench/auto_v2_heldout_T1
bench $H --temperatures 0,1 --batch-size 4 --methods $M --out-dir docs/bench/auto_v2_heldout_b4
bench --prompts assets/prompts/windows.jsonl --limit 160 --temperatures 0 --batch-size 1 --methods $M \
  --out-dir docs/bench/auto_v2_windows
