#!/bin/sh
# Issue 41, serving-time adaptation and `auto` over long jobs: the study's one entry (results.md).
# Stages (STAGES narrows them):
#   prompts  make_prompts.py: assets/prompts/shift_sympy.jsonl and indomain.jsonl from local files
#   bench    each job (JOBS, default all five) with target-only, EAGLE-3 and SpecBlock, plain,
#            adapted and under `auto`, 4 rounds, 128 new tokens, --queue 64 (results.md "Commands";
#            each recorded run's exact command is in its folder's results.json.gz, meta.command)
#   summary  summary.py: the tables of every job's run folder
# Run alone on the machine (hours: 67k-131k new tokens a method).
set -e
H=benchmarks/long_jobs
PY=${PY:-.venv/bin/python}
BENCH=${BENCH:-.venv/bin/specblock-bench}
OUT=${OUT:-outputs/benchmarks/long_jobs}
E=assets/drafters/eagle3; S=assets/drafters/specblock
A=adapt.expect=1:adapt.max_steps=32:adapt.costs_file=outputs/adapt_costs.json
M=ar,$E,$E:$A,auto:$E,$S,$S:adapt.train_window=64:$A,auto:$S
JOBS=${JOBS:-shift_T0_b1 shift_T0_b4 indomain_T0_b1 indomain_T0_b4 indomain_T1_b1}
for stage in ${STAGES:-prompts bench summary}; do
  case $stage in
    prompts) $PY $H/make_prompts.py;;
    bench)
      for job in $JOBS; do
        case $job in
          shift_*) P=assets/prompts/shift_sympy.jsonl;;
          indomain_*) P=assets/prompts/indomain.jsonl;;
        esac
        T=${job#*_T}; T=${T%%_*}; B=${job##*_b}
        $BENCH --target assets/target --prompts $P --rounds 4 --max-new-tokens 128 --queue 64 --methods $M \
          --temperatures $T --batch-size $B --out-dir $OUT/$job
      done;;
    summary) for job in $JOBS; do $PY $H/summary.py $OUT/$job; done;;
    *) echo "unknown stage $stage (prompts, bench, summary)" >&2; exit 2;;
  esac
done
