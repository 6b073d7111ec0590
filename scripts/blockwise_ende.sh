#!/usr/bin/env bash
# Blockwise parallel decoding at CPU scale on the Debian English->German corpus (after
# scripts/gad_ende.sh, whose distilled data and AR verifier it reuses):
#   for k in $KS: proposal heads on the frozen verifier ("regular") and the whole model
#   fine-tuned ("fine tuning"), then one benchmark: beam 5, greedy, blockwise exact/top-2/min-2.
#   scripts/blockwise_ende.sh [WORK_DIR]      (default work/)
# Environment: KS="2 4 8", FROZEN_UPDATES=150, FINETUNE_UPDATES=150 (per model), FINETUNE_LR=1e-4
# (fine-tuning moves the base away from the verifier: valid head-1 accuracy 0.272 frozen, 0.234
# after 67 updates at 5e-4; train-time head-1 accuracy includes dropout there), BENCH_N=400,
# VERIFIER (the AR checkpoint the heads sit on; default the teacher, which gad_ende.sh verifies with),
# KD (distilled data; default the teacher's greedy outputs from DISTILL_BEAM=1 if present: exact
# blockwise decoding accepts a head's token only when it equals the base model's greedy choice).
# The last checkpoint is used: validation is against the real references, not the teacher's outputs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=${1:-work}
data=$work/ende verifier=${VERIFIER:-$work/ende-teacher/checkpoint_best.pt}
export SRC=en TGT=de
[ -f "$verifier" ] || { echo "run scripts/gad_ende.sh first (needs $verifier)" >&2; exit 1; }
kd=${KD:-$work/ende-distill-beam1}
[ -z "${KD:-}" ] && [ ! -d "$kd/bin" ] && kd=$work/ende-distill
[ -d "$kd/bin" ] || { echo "no distilled data under $kd (run scripts/gad_ende.sh first)" >&2; exit 1; }
echo "heads on $verifier, trained on $kd/bin"
for k in ${KS:-2 4 8}; do
  for setting in frozen finetune; do
    save=$work/ende-blockwise-k$k-$setting
    [ -f "$save/checkpoint_last.pt" ] && continue
    extra=(--init-from-ar "$verifier" --warmup-updates 50)
    [ $setting = frozen ] && extra+=(--freeze-base --lr 1e-3)
    [ $setting = finetune ] && extra+=(--lr "${FINETUNE_LR:-1e-4}")
    updates=$([ $setting = frozen ] && echo "${FROZEN_UPDATES:-150}" || echo "${FINETUNE_UPDATES:-150}")
    bash "$here/train_ar.sh" "$kd/bin" "$save" 6 6 "$updates" --arch transformer_blockwise \
        --blockwise-k "$k" --criterion blockwise_cross_entropy "${extra[@]}"
  done
done
for k in ${KS:-2 4 8}; do
  for setting in frozen finetune; do
    ckpt=$work/ende-blockwise-k$k-$setting/checkpoint_last.pt
    fairseq-aggressive-bench "$data/bin" --user-dir "$here/../fairseq_aggressive" -s en -t de \
        --path "$ckpt" --gen-subset test --remove-bpe --batch-size 1 --threads 2 \
        --bench-max-sentences "${BENCH_N:-400}" \
        --bench-modes "${BENCH_MODES:-beam5,greedy,blockwise,blockwise-top2,blockwise-min2}" \
        --bench-json "$work/bench-blockwise-k$k-$setting.json" | tee "$work/bench-blockwise-k$k-$setting.txt"
  done
done
