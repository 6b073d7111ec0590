#!/usr/bin/env bash
# GAD at CPU scale on the Debian English->German corpus, end to end:
#   corpus -> teacher (AR 6+6) -> Seq-KD of the training set (beam 5) -> AR verifier (the
#   teacher, or the teacher fine-tuned on the distilled set) -> block_nat drafter on the distilled
#   set (encoder initialised from the teacher) -> benchmark (beam 5, greedy, GAD, GAD++).
#   scripts/gad_ende.sh [WORK_DIR]        (default work/)
# Budgets via environment, in updates (the same models on every machine): TEACHER_UPDATES=900,
# VERIFIER_UPDATES=0 (0: the teacher is the verifier), DRAFTER_UPDATES=850; DISTILL_SHARDS=7 (of 16
# shards of the training set); BLOCK=8 (training block size), BENCH_N=400, BENCH_MODES.
# DISTILL_BEAM=5 (Seq-KD beam; 1 distills the verifier's own greedy outputs). The drafter's
# last checkpoint is used (its validation loss is against the real references, not the teacher).
# A step whose output exists is skipped, so the script can be re-run after an interruption.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=${1:-work}
beam=${DISTILL_BEAM:-5}
data=$work/ende teacher=$work/ende-teacher kd=$work/ende-distill$([ "$beam" = 5 ] || echo "-beam$beam")
verifier=$work/ende-verifier drafter=$work/ende-drafter-k${BLOCK:-8}$([ "$beam" = 5 ] || echo "-beam$beam")
export SRC=en TGT=de
[ -d "$data/bin" ] || python "$here/prepare_debian_ende.py" --out "$data" --workers 1
[ -f "$teacher/checkpoint_best.pt" ] || bash "$here/train_ar.sh" "$data/bin" "$teacher" 6 6 "${TEACHER_UPDATES:-900}"
[ -d "$kd/bin" ] || python "$here/distill.py" --teacher "$teacher/checkpoint_best.pt" --data "$data/bin" \
    --out "$kd" --cpu --beam "$beam" --num-shards 16 --max-shards "${DISTILL_SHARDS:-7}" --max-len-a 1.2 --max-len-b 10
# the verifier: the teacher itself (VERIFIER_UPDATES=0, default), or the teacher fine-tuned on the
# distilled set for VERIFIER_UPDATES updates (--finetune-from-model counts updates from 0)
if [ "${VERIFIER_UPDATES:-0}" = 0 ]; then
  verifier=$teacher
elif [ ! -f "$verifier/checkpoint_best.pt" ]; then
  bash "$here/train_ar.sh" "$kd/bin" "$verifier" 6 6 "${VERIFIER_UPDATES}" \
    --finetune-from-model "$teacher/checkpoint_best.pt" --lr-scheduler fixed --warmup-updates 50 --lr 5e-4
fi
[ -f "$drafter/checkpoint_best.pt" ] || bash "$here/train_drafter.sh" "$kd/bin" "$drafter" 6 3 "${BLOCK:-8}" \
    "${DRAFTER_UPDATES:-850}" --init-encoder-from "$teacher/checkpoint_best.pt"
fairseq-aggressive-bench "$data/bin" --user-dir "$here/../fairseq_aggressive" -s en -t de \
    --path "$verifier/checkpoint_best.pt" --drafter-path "$drafter/checkpoint_last.pt" \
    --gen-subset test --remove-bpe --batch-size 1 --threads 2 --bench-max-sentences "${BENCH_N:-400}" \
    --bench-modes "${BENCH_MODES:-beam5,greedy,gad@4,gad@8,gad@16,gad-bf16@8,gad++@8}" \
    --bench-json "$work/bench-gad-ende.json" | tee "$work/bench-gad-ende.txt"
