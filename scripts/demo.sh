#!/usr/bin/env bash
# The newcomer's demo (make demo): bundled UA-GEC sample -> BPE + binarize ->
# train a small 9+3 deep/shallow Transformer (bounded time) -> decode the test
# sample with beam 5, greedy and IAD -> speedups, and IAD == greedy.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-$here/work}
minutes=${DEMO_TRAIN_MINUTES:-6}
data=$work/demo-data
ckpt=$work/demo-ckpt
export MALLOC_TRIM_THRESHOLD_=${MALLOC_TRIM_THRESHOLD_:-8000000000} MALLOC_TOP_PAD_=${MALLOC_TOP_PAD_:-1000000000}

echo "== 1/4 prepare the bundled UA-GEC sample ($here/data/uagec-sample)"
python "$here/scripts/prepare_uagec.py" --from-text "$here/data/uagec-sample" --out "$data" --bpe-ops 2000

echo "== 2/4 train a small 9+3 Transformer for at most $minutes minutes (fairseq-train, CPU bf16)"
if [ ! -f "$ckpt/checkpoint_last.pt" ]; then
  fairseq-train "$data/bin" --user-dir "$here/fairseq_aggressive" \
    --task aggressive_translation --source-lang src --target-lang tgt \
    --arch transformer_deep_shallow --encoder-layers 9 --decoder-layers 3 \
    --encoder-embed-dim 64 --decoder-embed-dim 64 --encoder-ffn-embed-dim 256 --decoder-ffn-embed-dim 256 \
    --encoder-attention-heads 4 --decoder-attention-heads 4 \
    --encoder-normalize-before --decoder-normalize-before --share-all-embeddings --dropout 0 \
    --optimizer adam --adam-betas '(0.9, 0.98)' --lr 3e-3 --lr-scheduler inverse_sqrt --warmup-updates 100 \
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-tokens 3000 \
    --max-update 1500 --stop-time-hours "$(python -c "print($minutes / 60)")" \
    --save-dir "$ckpt" --no-epoch-checkpoints --num-workers 0 --log-format simple --log-interval 50 \
    --cpu-bf16 --seed 1 2>&1 | grep -E "valid on|done training"
else
  echo "(found $ckpt/checkpoint_last.pt; delete it to retrain)"
fi

echo "== 3/4 fairseq-generate --decoding iad (first hypotheses)"
fairseq-generate "$data/bin" --path "$ckpt/checkpoint_last.pt" --user-dir "$here/fairseq_aggressive" \
  --task aggressive_translation --gen-subset test --beam 1 --decoding iad --batch-size 32 --remove-bpe \
  > "$work/demo-generate.out" 2> "$work/demo-generate.log"
grep -E "^(S|H)-" "$work/demo-generate.out" | sed -n 1,6p
grep -E "Translated|aggressive decoding" "$work/demo-generate.log" | sed 's/^INFO:[a-z_.]*://'

echo "== 4/4 beam 5 vs greedy vs IAD, batch 1, 2 threads (fairseq-aggressive-bench)"
fairseq-aggressive-bench "$data/bin" --path "$ckpt/checkpoint_last.pt" --gen-subset test --remove-bpe \
  --batch-size 1 --threads 2 --bench-json "$work/demo-bench.json" --bench-plot "$work/demo-bench.png" \
  2> "$work/demo-bench.log"
python - "$work/demo-bench.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["modes"]
n = json.load(open(sys.argv[1]))["sentences"]
print(f"IAD output identical to greedy: {r['iad']['identical_to_greedy']}/{n} sentences")
print(f"speedup over beam 5: greedy {r['greedy']['speedup_vs_beam5']:.2f}x, IAD {r['iad']['speedup_vs_beam5']:.2f}x;"
      f" IAD over greedy {r['iad']['speedup_vs_greedy']:.2f}x")
PY
echo "(JSON and the speedup-vs-edit-ratio plot: $work/demo-bench.json, $work/demo-bench.png)"
