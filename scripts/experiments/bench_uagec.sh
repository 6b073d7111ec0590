#!/usr/bin/env bash
# The UA-GEC benchmark of 6+6 and 9+3 models trained by scripts/experiments/train_ar.sh on the
# full corpus (scripts/data/prepare_uagec.py --out work/uagec), test set, 2 threads.
#   scripts/experiments/bench_uagec.sh [WORK=work] [BATCH=1]
set -euo pipefail
work=${WORK:-work} batch=${BATCH:-1}
common=(--gen-subset test --remove-bpe --batch-size "$batch" --threads 2 --warmup 10)
fairseq-aggressive-bench "$work/uagec/bin" --path "$work/uagec-6x6/checkpoint_best.pt" "${common[@]}" \
  --bench-json "$work/bench-6x6-b$batch.json" --bench-plot "$work/bench-6x6-b$batch.png"
fairseq-aggressive-bench "$work/uagec/bin" --path "$work/uagec-9x3/checkpoint_best.pt" "${common[@]}" \
  --baseline-path "$work/uagec-6x6/checkpoint_best.pt" \
  --bench-json "$work/bench-9x3-b$batch.json" --bench-plot "$work/bench-9x3-b$batch.png"
