#!/bin/sh
# Per-request tau at block sizes 4-8 (greedy, 64 new tokens) on the train, held-out and HumanEval
# prompts of the priced-label study; resumable (prompts already written are skipped). Then the
# compact committed table: benchmarks/blockpilot_priced/tau.json (tau_table.py export).
# Run from the repository root: nohup nice -n 19 sh benchmarks/blockpilot_priced/labels.sh &
set -e
# one persistent XLA cache for the three runs: the same (size, prompt bucket) loops compile once
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-data/blockpilot-v5p/xla_cache}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
C=configs/drafters/blockpilot-v5p.yaml
L=data/blockpilot-v5p
.venv/bin/specblock-train blockpilot labels --config $C \
  --prompts assets/prompts/humaneval.jsonl --skip 0 --limit 24 --out $L/humaneval
.venv/bin/specblock-train blockpilot labels --config $C \
  --prompts assets/prompts/heldout.jsonl --skip 0 --limit 200 --out $L/heldout
.venv/bin/specblock-train blockpilot labels --config $C
.venv/bin/python benchmarks/blockpilot_priced/tau_table.py export
