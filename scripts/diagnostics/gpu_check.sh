#!/usr/bin/env bash
# The project on a CUDA machine, in one short run: the tests marked `cuda` (every drafter on the
# torch verifier against fairseq's greedy on the GPU, float32 and float16), kernel launches per
# decoder pass, then fairseq-aggressive-bench --bench-device cuda on the shipped models, a
# Transformer-base-width copy of the 9+3 GEC model and the en-de student with its drafters.
#
#   scripts/diagnostics/gpu_check.sh OUT_DIR [PACKAGES_DIR] [DATA_DIR]
#
# PACKAGES_DIR: Python packages the machine lacks (fairseq-fixed, hydra-core, omegaconf,
# antlr4-python3-runtime, bitarray, sacremoses, subword-nmt), as unpacked wheels, put first on
# PYTHONPATH; DATA_DIR: binarized test sets (uagec/ as `make demo` writes work/demo/data/bin,
# ende/ as `make demo-mt` writes work/demo-mt/data/bin). Everything goes to OUT_DIR/log.txt, each
# benchmark's JSON to OUT_DIR/NAME.json (to store: python scripts/results.py add OUT_DIR/NAME.json
# results/gpu/NAME.json --label MODEL).
set -u -o pipefail
out=${1:?usage: gpu_check.sh OUT_DIR [PACKAGES_DIR] [DATA_DIR]}
packages=${2:-}
data=${3:-work}
py=${PYTHON:-python3}
mkdir -p "$out"
[ -n "$packages" ] && export PYTHONPATH=$(realpath "$packages"):$PWD${PYTHONPATH:+:$PYTHONPATH}
export FAIRSEQ_AGGRESSIVE_NO_NATIVE=1 PYTHONUNBUFFERED=1 py data
log="$out/log.txt"
bench() { $py -c 'from fairseq_aggressive.bench import cli_main; cli_main()' "$@"; }
# step NAME SECONDS CMD...: CMD's output under a header in the log (its stderr's end if it failed)
step() {
    local name=$1 secs=$2; shift 2
    echo "== $name" | tee -a "$log"
    # the shell functions of this script travel into the timed shell
    timeout "$secs" bash -c "$(declare -f machine bench gec ende); \"\$@\"" step "$@" 2>/tmp/fa-step.err \
        | tee -a "$log"
    local rc=${PIPESTATUS[0]}
    if [ "$rc" != 0 ]; then echo "-- exit $rc; stderr's end:" | tee -a "$log"; tail -6 /tmp/fa-step.err | tee -a "$log"; fi
}

machine() {
    nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    $py -c 'import torch, fairseq, numpy; print("torch", torch.__version__, "cuda", torch.version.cuda, "| fairseq",
fairseq.__version__, "| numpy", numpy.__version__)'
    lscpu | grep -E "Model name|^CPU\(s\)"
}
# in order of what matters most, each with its own time limit (a run cut short keeps what it logged)
step machine 30 machine
step "tests marked cuda" 150 $py -m pytest -q -p no:cacheprovider -m cuda -rs tests/test_cuda.py

gec() {  # CHECKPOINT BATCH MODES [ARGS...]
    local ckpt=$1 b=$2 modes=$3; shift 3
    bench "$data/uagec" --path "$ckpt" --source-lang src --target-lang tgt --gen-subset test --remove-bpe \
        --max-len-a 1.2 --max-len-b 10 --bench-device cuda --warmup 5 --batch-size "$b" --bench-modes "$modes" "$@"
}
ende() {  # BATCH MODES [ARGS...]
    local b=$1 modes=$2; shift 2
    bench "$data/ende" --path models/ende-student-6x1/model.pt --source-lang en --target-lang de \
        --gen-subset test --remove-bpe --max-len-a 1.2 --max-len-b 10 --bench-device cuda --warmup 5 \
        --drafter-path models/ende-student-6x1-gad-drafter/model.pt \
        --bench-feature-drafter models/ende-student-6x1-feature-drafter/model.pt --batch-size "$b" \
        --bench-modes "$modes" "$@"
}
one=(--bench-max-sentences 100)  # batch 1: the first 100 sentences; batch 32: all 300
step "bench 9+3 (shipped) batch 1 float32" 60 gec models/uagec-9x3/model.pt 1 beam5,greedy,iad "${one[@]}" \
    --bench-json "$out/9x3-b1.json"
step "bench 9+3 (shipped) batch 32 float32" 45 gec models/uagec-9x3/model.pt 32 beam5,greedy,iad \
    --bench-json "$out/9x3-b32.json"
step "bench en-de student 6+1 batch 1 float32" 60 ende 1 beam5,greedy,gad@8,feature-ar@8 "${one[@]}" \
    --bench-json "$out/ende-b1.json"
step "bench en-de student 6+1 batch 32 float32" 45 ende 32 beam5,greedy,gad@8,feature-ar@8 \
    --bench-json "$out/ende-b32.json"
step "kernel launches per pass, 9+3, float32" 45 $py scripts/diagnostics/gpu_launches.py models/uagec-9x3 "$data/uagec" \
    --sentences 8

# Transformer-base width: the 9+3 at d=512, 8 heads, ffn 2048 (the same function as the 9+3)
step "widen 9+3 to d=512" 40 $py scripts/experiments/widen_model.py models/uagec-9x3/model.pt /tmp/d512.pt \
    --dim 512 --ffn 2048 --heads 8
step "bench 9+3 at d=512 batch 1 float32" 60 gec /tmp/d512.pt 1 beam5,greedy,iad "${one[@]}" \
    --bench-json "$out/d512-b1.json"
step "bench 9+3 at d=512 batch 32 float32" 45 gec /tmp/d512.pt 32 beam5,greedy,iad \
    --bench-json "$out/d512-b32.json"
step "kernel launches per pass and attention backends, 9+3, float16" 90 $py scripts/diagnostics/gpu_launches.py \
    models/uagec-9x3 "$data/uagec" --fp16 --sentences 8 --sdpa-backends
step "bench 9+3 (shipped) batch 1 float16" 70 gec models/uagec-9x3/model.pt 1 greedy,iad --fp16 "${one[@]}" \
    --bench-json "$out/9x3-b1-fp16.json"
step "bench 9+3 (shipped) batch 32 float16" 45 gec models/uagec-9x3/model.pt 32 greedy,iad --fp16 \
    --bench-json "$out/9x3-b32-fp16.json"
step "bench 9+3 at d=512 batch 1 float16" 70 gec /tmp/d512.pt 1 greedy,iad --fp16 "${one[@]}" \
    --bench-json "$out/d512-b1-fp16.json"
