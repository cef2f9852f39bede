#!/bin/sh
# Target-only, prompt lookup, EAGLE-3 (2,048-token draft vocabulary), SpecBlock (3 training blocks,
# the same draft vocabulary) and DFlash (trained at block 8) at their shipped settings on held-out
# and HumanEval prompts, T=0 and T=1, batch 1 and 8, 128 new tokens; then, on held-out prompts at
# T=0, batch 1, each drafter at the setting `calibrate` picks on this machine, and SpecBlock's
# accelerator-scale tree (slot 0 drafts 10, 10 leaves per later level, 90 nodes, 2 blocks: the
# reference's "1,2,10,90") for tau and drafter forwards per token. Every run interleaves its methods
# over 4 rounds of prompts (--rounds). Run from the repository root on an otherwise idle machine (no
# training, no tests): sh benchmarks/methods_v2/run.sh. Results go to outputs/benchmarks/methods_v2/.
LIMIT=${LIMIT:-40}
HE_LIMIT=${HE_LIMIT:-24}
OUT=outputs/benchmarks/methods_v2
E=assets/drafters/eagle3
S=assets/drafters/specblock
D=assets/drafters/dflash
B="--target assets/target --max-new-tokens 128 --rounds 4"
G="--calibrate-grid num_nodes=6,10,16 --calibrate-grid depth=3,5 --calibrate-grid max_blocks=2,3 --calibrate-grid block_size=4,6,8"
set -e
.venv/bin/specblock-bench $B --temperatures 0,1 --batch-size 1,8 --limit $LIMIT \
  --prompts assets/prompts/heldout.jsonl --out-dir $OUT/heldout --methods ar,prompt_lookup,$E,$S,$D
.venv/bin/specblock-bench $B --temperatures 0 --batch-size 1 --limit $LIMIT $G \
  --prompts assets/prompts/heldout.jsonl --out-dir $OUT/heldout_calibrated \
  --methods ar,$E:calibrate=true,$S:calibrate=true,$D:calibrate=true,$S:root_topk=10:beam=10:num_nodes=90:max_blocks=2
.venv/bin/specblock-bench $B --temperatures 0,1 --batch-size 1,8 --limit $HE_LIMIT \
  --prompts assets/prompts/humaneval.jsonl --out-dir $OUT/humaneval --methods ar,prompt_lookup,$E,$S,$D
