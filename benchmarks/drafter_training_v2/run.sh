#!/bin/sh
# The drafters on target v2 (results.md): the study's one entry. Trains each run results.md reports,
# in order, with the console script (hours each on the 2-core CPU; each resumes after a kill).
# RUNS narrows them: main (EAGLE-3, SpecBlock compute-matched, DFlash block 8, the data-matched
# SpecBlock with prefix_norm=all = the shipped one, DFlash trained on to the stopping rule), ablations
# (SpecBlock without valid-prefix masking / without the layer shift; EAGLE-3 with the full head).
# The metrics logs results.md plots are copied here as *_metrics.jsonl.
set -e
TRAIN=${TRAIN:-.venv/bin/specblock-train}
for run in ${RUNS:-main ablations}; do
  case $run in
    main)
      $TRAIN eagle3 --config configs/drafters/eagle3-v2.yaml
      $TRAIN specblock --config configs/drafters/specblock-v2.yaml
      $TRAIN dflash --config configs/drafters/dflash-v2.yaml
      $TRAIN specblock --config configs/drafters/specblock-v2-data.yaml prefix_norm=all \
        name=specblock-v2-data-vpall out_dir=runs/specblock/specblock-v2-data-vpall/export
      $TRAIN dflash --config configs/drafters/dflash-v2-plateau.yaml;;
    ablations)
      $TRAIN specblock --config configs/drafters/specblock-v2.yaml name=ablate-novp \
        valid_prefix=false out_dir=runs/ablate/novp-drafter
      $TRAIN specblock --config configs/drafters/specblock-v2.yaml name=ablate-noshift \
        layer_shift=false out_dir=runs/ablate/noshift-drafter
      $TRAIN eagle3 --config configs/drafters/eagle3-v2.yaml name=eagle3-v2-full draft_vocab_size=0 \
        out_dir=runs/eagle3/eagle3-v2-full/export;;
    *) echo "unknown run set $run (main, ablations)" >&2; exit 2;;
  esac
done
