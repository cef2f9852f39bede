#!/bin/sh
# Per-request tau at block sizes 4-8 (greedy, 64 new tokens) on the train, held-out and HumanEval
# prompts of the priced-label study, the three splits in parallel; resumable (prompts already
# written are skipped). Then the compact committed table: benchmarks/blockpilot_priced/tau.json
# (tau_table.py export). Logs: data/blockpilot-v5p/<split>.log.
# Run from the repository root: nohup nice -n 19 sh benchmarks/blockpilot_priced/labels.sh &
set -e
# one persistent XLA cache for the three runs: the same (size, prompt bucket) loops compile once
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-data/blockpilot-v5p/xla_cache}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
C=configs/drafters/blockpilot-v5p.yaml
L=data/blockpilot-v5p
mkdir -p $L
# on a fresh checkout, start from the committed partial runs (partial_tau/: raw per-size files)
for s in humaneval heldout train; do
  [ -d $L/$s ] || cp -r benchmarks/blockpilot_priced/partial_tau/$s $L/$s
done
.venv/bin/specblock-train blockpilot labels --config $C \
  --prompts assets/prompts/humaneval.jsonl --skip 0 --limit 24 --out $L/humaneval > $L/humaneval.log 2>&1 &
H=$!
.venv/bin/specblock-train blockpilot labels --config $C \
  --prompts assets/prompts/heldout.jsonl --skip 0 --limit 200 --out $L/heldout > $L/heldout.log 2>&1 &
E=$!
.venv/bin/specblock-train blockpilot labels --config $C > $L/train.log 2>&1 &
T=$!
wait $H && wait $E && wait $T
.venv/bin/python benchmarks/blockpilot_priced/tau_table.py export
