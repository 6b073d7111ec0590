#!/usr/bin/env bash
# Train a block_nat drafter (GAD) with glancing block training, stock fairseq-train and our task.
#   scripts/train_drafter.sh DATA_BIN SAVE_DIR ENC_LAYERS DEC_LAYERS BLOCK_SIZE UPDATES [extra fairseq-train args]
# The budget is a number of updates; float32 (CPU_BF16=--cpu-bf16: bfloat16 where native).
# CPU-sized widths (d=128, ffn 512) like scripts/train_ar.sh; add e.g. --init-encoder-from TEACHER.pt
# (same widths) to start from an AR encoder, or --arch block_nat_big for the papers' big drafter on GPUs.
# Language pair: SRC/TGT environment variables (default src/tgt).
set -euo pipefail
data=$1 save=$2 enc=$3 dec=$4 k=$5 updates=$6
shift 6
export MALLOC_TRIM_THRESHOLD_=${MALLOC_TRIM_THRESHOLD_:-8000000000} MALLOC_TOP_PAD_=${MALLOC_TOP_PAD_:-1000000000}
mkdir -p "$save"
fairseq-train "$data" \
    --user-dir "$(dirname "$0")/../fairseq_aggressive" \
    --task aggressive_translation --source-lang "${SRC:-src}" --target-lang "${TGT:-tgt}" \
    --arch block_nat --encoder-layers "$enc" --decoder-layers "$dec" \
    --encoder-embed-dim 128 --decoder-embed-dim 128 \
    --encoder-ffn-embed-dim 512 --decoder-ffn-embed-dim 512 \
    --encoder-attention-heads 4 --decoder-attention-heads 4 \
    --encoder-normalize-before --decoder-normalize-before \
    --share-all-embeddings --dropout 0.1 \
    --criterion glat_block_loss --block-size "$k" --label-smoothing 0.1 \
    --glat-start 0.5 --glat-end 0.3 --glat-anneal-updates "${GLAT_ANNEAL:-2000}" \
    --optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 1.0 \
    --lr 2e-3 --lr-scheduler inverse_sqrt --warmup-updates 200 \
    --max-tokens 4000 --max-update "$updates" --max-epoch 1000 \
    --save-dir "$save" --no-epoch-checkpoints --keep-last-epochs 1 \
    --log-format simple --log-interval 50 --num-workers 0 --seed 1 \
    ${CPU_BF16:-} "$@" 2>&1 | tee "$save/train.log"
