#!/bin/sh
# Auto serving on target v2 (target-only or speculation at a few tree budgets, whichever measures
# fastest as the job runs): all 200 held-out prompts, 128 new tokens (25,600 tokens per method and
# group), then window prompts 0-159 (a domain shift, 20,480 tokens per method); methods interleaved
# over 4 rounds. Run alone (nothing else on the machine), from the repository root:
# sh benchmarks/auto_serving/run.sh. Results go to outputs/benchmarks/auto_serving/.
# The 8-method group needs vm.max_map_count above Linux's default 65,530 (XLA:CPU maps each
# executable's code in many sections; past that, "LLVM compilation error: Cannot allocate memory"):
# sysctl -w vm.max_map_count=262144.
OUT=outputs/benchmarks/auto_serving
E=assets/drafters/eagle3; S=assets/drafters/specblock; D=assets/drafters/dflash
bench() { .venv/bin/specblock-bench --target assets/target --rounds 4 --max-new-tokens 128 "$@"; }
set -e
# 1. T = 0, batch 1, where EAGLE-3 pays: plain EAGLE-3, SpecBlock (and its fixed-branching
#    ablation) and DFlash beside the auto variants.
H="--prompts assets/prompts/heldout.jsonl --limit 200"
bench $H --temperatures 0 --batch-size 1 --methods ar,$E,auto:$E,auto:$S,$D,auto:$D,$S,$S:rank_tree=false \
  --out-dir $OUT/heldout200_T0_b1
# 2. T = 1 at batch 1, and batch 4 at T = 0 and 1, where no drafter pays
#    (adaptation_indomain, docs/findings.md): target-only and the auto variants only.
A=ar,auto:$E,auto:$S,auto:$D
bench $H --temperatures 1 --batch-size 1 --methods $A --out-dir $OUT/heldout200_T1_b1
bench $H --temperatures 0,1 --batch-size 4 --methods $A --out-dir $OUT/heldout200_b4
# 3. Domain shift: window prompts 0-159, T = 0, batch 1.
bench --prompts assets/prompts/windows.jsonl --limit 160 --temperatures 0 --batch-size 1 \
  --methods ar,$E,auto:$E,auto:$S,auto:$D --out-dir $OUT/windows_T0_b1
