#!/usr/bin/env bash
# First-run, second-run and resumed-job wall time of `specblock-decode` on 20 HumanEval prompts with
# EAGLE-3, without JAX's persistent compilation cache (--no-compile-cache: every process compiles)
# and with it (a fresh cache folder per round: the first run fills it, the second and the resumed
# job read it). 3 rounds; run alone on the machine. Writes times.tsv (round, mode, run, seconds).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/compile_cache_bench}
rm -rf "$OUT"; mkdir -p "$OUT"
head -20 assets/prompts/humaneval.jsonl > "$OUT/p20.jsonl"
decode() {  # decode OUTFILE [flags...]: prints the wall seconds of one specblock-decode process
  local out=$1; shift
  local t0=$(date +%s.%N)
  .venv/bin/specblock-decode --prompts "$OUT/p20.jsonl" --out "$out" --method assets/drafters/eagle3 \
    --max-new-tokens 64 --batch-size 4 "$@" > /dev/null 2>&1
  echo "$(date +%s.%N) - $t0" | bc
}
echo -e "round\tmode\trun\tseconds" > "$OUT/times.tsv"
for round in 1 2 3; do
  for mode in off on; do
    flags=(--no-compile-cache); [ $mode = on ] && flags=(--compile-cache "$OUT/cache$round")
    first=$(decode "$OUT/a$round$mode.jsonl" "${flags[@]}")
    second=$(decode "$OUT/b$round$mode.jsonl" "${flags[@]}")
    head -10 "$OUT/a$round$mode.jsonl" > "$OUT/r$round$mode.jsonl"  # a job killed after 10 records
    resumed=$(decode "$OUT/r$round$mode.jsonl" "${flags[@]}")
    printf "%s\t%s\tfirst\t%s\n%s\t%s\tsecond\t%s\n%s\t%s\tresumed\t%s\n" $round $mode $first $round $mode $second \
      $round $mode $resumed | tee -a "$OUT/times.tsv"
  done
done
cp "$OUT/times.tsv" benchmarks/compile_cache/times.tsv
