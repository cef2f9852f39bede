#!/bin/sh
# Issue 19's `auto` on target v2 after session 11's changes (a warmed first run, no exploring a larger
# tree than a losing one, no re-check near the job's end), on longer jobs than
# docs/bench/adaptation_v2.sh: all 200 held-out prompts, 128 new tokens (25,600 tokens per method
# and group). Adaptation is not rerun (unchanged since adaptation_v2.sh).
# Run alone (nothing else on the machine), from the repository root: sh docs/bench/auto_v2.sh
# The 8-method group needs vm.max_map_count above Linux's default 65,530 (XLA:CPU maps each executable's
# code in many sections; the first run of group 1 ended at about that many maps, "LLVM compilation
# error: Cannot allocate memory"): sysctl -w vm.max_map_count=262144. Group 1 ran last (rerun).
# 1. T = 0, batch 1, where EAGLE-3 pays: plain EAGLE-3, SpecBlock (with its fixed-branching
#    ablation, issue 17) and DFlash beside the auto variants.
# 2. T = 1 at batch 1, and batch 4 at T = 0 and 1, where no drafter pays (docs/bench/adaptation_v2_*):
#    target-only and the auto variants only (a session's time did not fit the plain drafters again).
E=assets/drafters/eagle3; S=assets/drafters/specblock; D=assets/drafters/dflash
bench() { .venv/bin/specblock-bench --target assets/target --prompts assets/prompts/heldout.jsonl --limit 200 \
  --rounds 4 --max-new-tokens 128 "$@"; }
bench --temperatures 0 --batch-size 1 --methods ar,$E,auto:$E,auto:$S,$D,auto:$D,$S,$S:rank_tree=false \
  --out-dir docs/bench/auto_v2_heldout200
A=ar,auto:$E,auto:$S,auto:$D
bench --temperatures 1 --batch-size 1 --methods $A --out-dir docs/bench/auto_v2_heldout_T1
bench --temperatures 0,1 --batch-size 4 --methods $A --out-dir docs/bench/auto_v2_heldout_b4
# 3. Domain shift: window prompts 0-159 (20,480 tokens per method), T = 0, batch 1 (run last).
bench() { .venv/bin/specblock-bench --target assets/target --rounds 4 --max-new-tokens 128 "$@"; }
bench --prompts assets/prompts/windows.jsonl --limit 160 --temperatures 0 --batch-size 1 \
  --methods ar,$E,auto:$E,auto:$S,auto:$D --out-dir docs/bench/auto_v2_windows
