#!/usr/bin/env bash
# GAD at CPU scale on the Debian English->German corpus, end to end:
#   corpus -> teacher (AR 6+6) -> Seq-KD of the training set (beam 5) -> AR verifier
#   (the teacher fine-tuned on the distilled set) -> block_nat drafter on the distilled set
#   (encoder initialised from the teacher) -> benchmark (beam 5, greedy, GAD, GAD++).
#   scripts/gad_ende.sh [WORK_DIR]        (default work/)
# Time budgets (minutes) via environment: TEACHER_MIN=30 DISTILL_MIN=15 VERIFIER_MIN=10
# DRAFTER_MIN=25, BLOCK=8 (training block size), BENCH_N=500 sentences, BENCH_MODES.
# A step whose output exists is skipped, so the script can be re-run after an interruption.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=${1:-work}
data=$work/ende teacher=$work/ende-teacher kd=$work/ende-distill
verifier=$work/ende-verifier drafter=$work/ende-drafter-k${BLOCK:-8}
export SRC=en TGT=de
[ -d "$data/bin" ] || python "$here/prepare_debian_ende.py" --out "$data" --workers 1
[ -f "$teacher/checkpoint_best.pt" ] || bash "$here/train_ar.sh" "$data/bin" "$teacher" 6 6 "${TEACHER_MIN:-30}"
[ -d "$kd/bin" ] || python "$here/distill.py" --teacher "$teacher/checkpoint_best.pt" --data "$data/bin" \
    --out "$kd" --cpu --num-shards 16 --max-minutes "${DISTILL_MIN:-15}" --max-len-a 1.2 --max-len-b 10
[ -f "$verifier/checkpoint_best.pt" ] || bash "$here/train_ar.sh" "$kd/bin" "$verifier" 6 6 "${VERIFIER_MIN:-10}" \
    --finetune-from-model "$teacher/checkpoint_best.pt" --lr-scheduler fixed --warmup-updates 50 --lr 5e-4
[ -f "$drafter/checkpoint_best.pt" ] || bash "$here/train_drafter.sh" "$kd/bin" "$drafter" 6 3 "${BLOCK:-8}" \
    "${DRAFTER_MIN:-25}" --init-encoder-from "$teacher/checkpoint_best.pt"
fairseq-aggressive-bench "$data/bin" --user-dir "$here/../fairseq_aggressive" -s en -t de \
    --path "$verifier/checkpoint_best.pt" --drafter-path "$drafter/checkpoint_best.pt" \
    --gen-subset test --remove-bpe --batch-size 1 --threads 2 --bench-max-sentences "${BENCH_N:-500}" \
    --bench-modes "${BENCH_MODES:-beam5,greedy,gad@4,gad@8,gad@16,gad-bf16@8,gad++@8}" \
    --bench-json "$work/bench-gad-ende.json" | tee "$work/bench-gad-ende.txt"
