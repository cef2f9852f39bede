#!/bin/sh
# Per-request tau at block sizes 4-8 (greedy, 64 new tokens) on the train, held-out and HumanEval
# prompts of the priced-label study; resumable (prompts already written are skipped). Then the
# compact committed table: benchmarks/blockpilot_priced/tau.json (export_tau.py).
# Run from the repository root: nohup nice -n 19 sh benchmarks/blockpilot_priced/labels.sh &
set -e
C=configs/drafters/blockpilot-v5p.yaml
L=data/blockpilot-v5p
.venv/bin/specblock-train blockpilot labels --config $C \
  --prompts assets/prompts/humaneval.jsonl --skip 0 --limit 24 --out $L/humaneval
.venv/bin/specblock-train blockpilot labels --config $C \
  --prompts assets/prompts/heldout.jsonl --skip 0 --limit 200 --out $L/heldout
.venv/bin/specblock-train blockpilot labels --config $C
