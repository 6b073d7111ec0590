#!/usr/bin/env bash
# Train an autoregressive Transformer (the verifier) with stock fairseq-train and our task.
#   scripts/train_ar.sh DATA_BIN SAVE_DIR ENC_LAYERS DEC_LAYERS UPDATES [extra fairseq-train args]
# The budget is a number of updates (the same model on every machine). float32; CPU_BF16=--cpu-bf16
# adds bfloat16 autocast where the CPU has it natively.
# Widths default to a CPU-sized model (d=128, ffn 512: ~1000 updates learn UA-GEC on 2 cores); override with extra args, e.g.
#   --arch transformer_deep_shallow_big for the papers' big setting on GPUs.
# Language pair: SRC/TGT environment variables (default src/tgt, the GEC data).
set -euo pipefail
data=$1 save=$2 enc=$3 dec=$4 updates=$5
shift 5
# large tensors (logits) are mmap-ed afresh on every step without this: half the CPU went to page faults
export MALLOC_TRIM_THRESHOLD_=${MALLOC_TRIM_THRESHOLD_:-8000000000} MALLOC_TOP_PAD_=${MALLOC_TOP_PAD_:-1000000000}
mkdir -p "$save"
fairseq-train "$data" \
    --user-dir "$(dirname "$0")/../fairseq_aggressive" \
    --task aggressive_translation --source-lang "${SRC:-src}" --target-lang "${TGT:-tgt}" \
    --arch transformer_deep_shallow --encoder-layers "$enc" --decoder-layers "$dec" \
    --encoder-embed-dim 128 --decoder-embed-dim 128 \
    --encoder-ffn-embed-dim 512 --decoder-ffn-embed-dim 512 \
    --encoder-attention-heads 4 --decoder-attention-heads 4 \
    --encoder-normalize-before --decoder-normalize-before \
    --share-all-embeddings --dropout 0.1 \
    --optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 1.0 \
    --lr 2e-3 --lr-scheduler inverse_sqrt --warmup-updates 200 \
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
    --max-tokens 4000 --max-update "$updates" --max-epoch 1000 \
    --save-dir "$save" --no-epoch-checkpoints --keep-last-epochs 1 \
    --log-format simple --log-interval 50 --num-workers 0 --seed 1 \
    ${CPU_BF16:-} "$@" 2>&1 | tee "$save/train.log"
