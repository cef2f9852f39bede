#!/bin/sh
# BlockPilot / DFlash benchmark (run from the repository root)
D=assets/drafters/dflash
M=ar,$D:block_size=4,$D:block_size=8,$D:block_size=16,assets/drafters/blockpilot
.venv/bin/specblock-bench --target assets/target --prompts assets/prompts/humaneval.jsonl --methods $M \
  --temperatures 0,1 --batch-size 1 --max-new-tokens 128 --limit 40 --out-dir docs/bench/dflash_humaneval
.venv/bin/specblock-bench --target assets/target --prompts assets/prompts/heldout.jsonl --methods $M,$D:block_size=4:draft_mode=greedy \
  --temperatures 0,1 --batch-size 1 --max-new-tokens 128 --limit 40 --out-dir docs/bench/dflash_heldout
