#!/usr/bin/env bash
# Train an autoregressive Transformer (the verifier) with stock fairseq-train and our task.
#   scripts/experiments/train_ar.sh DATA_BIN SAVE_DIR ENC_LAYERS DEC_LAYERS UPDATES [extra fairseq-train args]
# The settings are the CPU-scale UA-GEC models' of configs/gec/bea19.yaml (d=128, ffn 512, pre-norm:
# ~1000 updates learn UA-GEC on 2 cores); print them with
#   python scripts/experiments/pipeline.py configs/gec/bea19.yaml --scale cpu --train-options 6x6
# The budget is a number of updates (the same model on every machine); float32 (CPU_BF16=--cpu-bf16
# adds bfloat16 autocast where the CPU has it natively). Extra args override the settings (the last
# occurrence wins), e.g. --encoder-embed-dim 512 ..., or --arch transformer_deep_shallow_big on GPUs.
# Language pair: SRC/TGT environment variables (default src/tgt, the GEC data).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
data=$1 save=$2 enc=$3 dec=$4 updates=$5
shift 5
# large tensors (logits) are mmap-ed afresh on every step without this: half the CPU went to page faults
export MALLOC_TRIM_THRESHOLD_=${MALLOC_TRIM_THRESHOLD_:-8000000000} MALLOC_TOP_PAD_=${MALLOC_TOP_PAD_:-1000000000}
settings=$(python "$here/pipeline.py" "$here/../../configs/gec/bea19.yaml" --scale cpu --train-options 6x6)
eval "settings=($settings)"
mkdir -p "$save"
fairseq-train "$data" \
    --user-dir "$here/../../fairseq_aggressive" \
    --task aggressive_translation --source-lang "${SRC:-src}" --target-lang "${TGT:-tgt}" \
    "${settings[@]}" --encoder-layers "$enc" --decoder-layers "$dec" --max-update "$updates" \
    --save-dir "$save" ${CPU_BF16:-} "$@" 2>&1 | tee "$save/train.log"
