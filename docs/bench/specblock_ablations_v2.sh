#!/bin/sh
# Issue 17's training ablations on target v2, run alone from the repository root after v2's data
# regeneration (assets/README.md, "Drafter training data"): sh docs/bench/specblock_ablations_v2.sh
# Each run is configs/drafters/specblock-v2.yaml with one switch off, stopped right after its
# evaluation at step 78 of the same 117-step schedule (2/3 of the compute-matched budget: 54.3
# TFLOP), so its eval tau compares with the shipped run's step-78 evaluation (same prompts, same
# 16-node tree) in docs/specblock_v2_metrics.jsonl. Logs: runs/specblock/<name>/metrics.jsonl.
for abl in valid_prefix=false layer_shift=false; do
  name=specblock-v2-no-$(echo "$abl" | cut -d= -f1 | tr _ -)
  log=runs/specblock/$name/metrics.jsonl
  .venv/bin/specblock-train specblock --config configs/drafters/specblock-v2.yaml name="$name" "$abl" \
    eval_every=78 out_dir="runs/specblock/$name/export" &
  pid=$!
  until grep -q '"step": 78, "eval_tau_mean"' "$log" 2>/dev/null || ! kill -0 $pid 2>/dev/null; do sleep 15; done
  kill $pid 2>/dev/null; wait $pid
  grep '"eval_tau_mean"' "$log"
done
