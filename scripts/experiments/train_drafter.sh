#!/usr/bin/env bash
# Train a block_nat drafter (GAD) with glancing block training, stock fairseq-train and our task.
#   scripts/experiments/train_drafter.sh DATA_BIN SAVE_DIR ENC_LAYERS DEC_LAYERS BLOCK_SIZE UPDATES [extra fairseq-train args]
# The settings are the CPU-scale drafter's of configs/translation/wmt14_ende.yaml (d=128, ffn 512,
# glancing 0.5 -> 0.3 over GLAT_ANNEAL=2000 updates); print them with
#   python scripts/experiments/pipeline.py configs/translation/wmt14_ende.yaml --scale cpu --train-options drafter
# The budget is a number of updates; float32 (CPU_BF16=--cpu-bf16: bfloat16 where native). Add e.g.
# --init-encoder-from TEACHER.pt (same widths) to start from an AR encoder, or --arch block_nat_big
# for the papers' big drafter on GPUs. Language pair: SRC/TGT environment variables (default src/tgt).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
data=$1 save=$2 enc=$3 dec=$4 k=$5 updates=$6
shift 6
export MALLOC_TRIM_THRESHOLD_=${MALLOC_TRIM_THRESHOLD_:-8000000000} MALLOC_TOP_PAD_=${MALLOC_TOP_PAD_:-1000000000}
settings=$(python "$here/pipeline.py" "$here/../../configs/translation/wmt14_ende.yaml" --scale cpu --train-options drafter)
eval "settings=($settings)"
mkdir -p "$save"
fairseq-train "$data" \
    --user-dir "$here/../../fairseq_aggressive" \
    --task aggressive_translation --source-lang "${SRC:-src}" --target-lang "${TGT:-tgt}" \
    "${settings[@]}" --encoder-layers "$enc" --decoder-layers "$dec" --block-size "$k" \
    --glat-anneal-updates "${GLAT_ANNEAL:-2000}" --max-update "$updates" \
    --save-dir "$save" ${CPU_BF16:-} "$@" 2>&1 | tee "$save/train.log"
