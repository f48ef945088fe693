#!/usr/bin/env bash
# Check swerl's trainer paths on a REAL GPU (run on a GPU machine; CPU-only machines test the
# same code over gloo).
#
#   deploy/gpu_check_trainer.sh [WORK_DIR]
#
# 0. The GPU tests (tests/gpu): both backends on cuda against the CPU and each other (fp32,
#    dense and MoE), a step, activation recompute, save -> load -> the same next step, an
#    export transformers loads, bf16 autocast with fp32 master weights.
# 1. `python -m trainer score` on the tiny model, torch and megatron backends, on cuda and on
#    the CPU: the per-token logprobs must agree (fp32, max |diff| < 1e-3).
# 2. The toy Li2SAO run (trainer/configs/toy_li2sao.yaml, 3 steps) through the whole local stack
#    with the trainer on cuda: torch backend fp32, torch backend bf16, megatron backend fp32,
#    megatron bf16, megatron with activation recompute. Each must exit 0 with 3 metrics rows and a checkpoint
#    of step 3.
# 3. With 2 or more GPUs: the same run under torchrun with 2 ranks (NCCL; rank 0 drives,
#    rank 1 follows): the torch backend (FSDP2), and the megatron backend as two pipeline
#    stages (fp32, and bf16) and as two context-parallel ranks (the toy model's one KV head
#    allows no tensor parallel); checkpoint shards of both ranks.
# 4. bench/bench_trainer.py --device cuda --quick, fp32 and bf16 (figures in
#    WORK/bench_trainer-{fp32,bf16}.{log,json}).
#
# Prints one PASS / FAIL line per check and exits non-zero if any failed. Needs `make setup`
# (the venv, the tiny and toy models, bwrap trees) and a CUDA build of torch.
#
# Environment:
#   PYTHON           python with swerl installed (default: .venv/bin/python)
#   SWERL_CACHE_DIR  where the tiny and toy models are (default: ~/.cache/swerl)
#   STEP_TIMEOUT     seconds one check may run before it is stopped and FAILs (default 900)
set -uo pipefail
[[ "${1:-}" == "-h" || "${1:-}" == "--help" ]] && { sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0; }

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$REPO/.venv/bin/python}"
WORK="${1:-$(mktemp -d /tmp/swerl-gpu-trainer.XXXXXX)}"
CACHE="${SWERL_CACHE_DIR:-$HOME/.cache/swerl}"
CONFIG="$REPO/trainer/configs/toy_li2sao.yaml"
FAILED=0
STEP_TIMEOUT="${STEP_TIMEOUT:-900}"
mkdir -p "$WORK"
cd "$REPO"


result() {  # NAME STATUS(0=pass) DETAIL
  if [[ "$2" == 0 ]]; then echo "PASS $1 $3"; else echo "FAIL $1 $3"; FAILED=1; fi
}

GPUS="$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')"
if [[ "$GPUS" -lt 1 ]]; then
  echo "FAIL cuda: torch sees no GPU (torch.cuda.is_available() is False)"
  exit 1
fi
echo "cuda: $GPUS GPU(s); work dir $WORK"

# 0. the GPU tests
timeout "$STEP_TIMEOUT" "$PY" -m pytest -q -p no:cacheprovider -o addopts="-ra --durations=10" tests/gpu \
  > "$WORK/pytest-gpu.log" 2>&1
code=$?
result pytest-gpu "$code" "($(tail -n 1 "$WORK/pytest-gpu.log"); $WORK/pytest-gpu.log)"

# 1. score parity, cuda vs CPU
"$PY" - "$WORK/score-in.jsonl" <<'EOF'
import json, random, sys
rng = random.Random(0)
with open(sys.argv[1], "w") as f:
    for n in range(8):
        ids = [rng.randrange(1, 1000) for _ in range(24 + 8 * n)]
        f.write(json.dumps({"input_ids": ids, "start": 4}) + "\n")
EOF
for backend in torch megatron; do
  ok=0
  for device in cpu cuda; do
    timeout "$STEP_TIMEOUT" "$PY" -m trainer score --backend "$backend" --model "$CACHE/tiny-model" --device "$device" \
      --input "$WORK/score-in.jsonl" --output "$WORK/score-$backend-$device.jsonl" \
      > "$WORK/score-$backend-$device.log" 2>&1 || ok=1
  done
  detail="(see $WORK/score-$backend-*.log)"
  if [[ $ok == 0 ]]; then
    detail="$("$PY" - "$WORK/score-$backend-cpu.jsonl" "$WORK/score-$backend-cuda.jsonl" <<'EOF'
import json, sys
a = [json.loads(l)["logprobs"] for l in open(sys.argv[1])]
b = [json.loads(l)["logprobs"] for l in open(sys.argv[2])]
diff = max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))
print(f"max|cuda-cpu|={diff:.2e}")
sys.exit(0 if diff < 1e-3 else 1)
EOF
)" || ok=1
  fi
  result "score-$backend" "$ok" "$detail"
done

# 2. and 3. the toy run with the trainer on cuda
toy_run() {  # NAME NPROC ENV...
  local name="$1" nproc="$2"; shift 2
  local dir="$WORK/toy-$name"
  timeout "$STEP_TIMEOUT" env "$@" SWERL_TRAINER__DEVICE=cuda "$PY" -m services.toy_train --config "$CONFIG" \
    --run-dir "$dir" --steps 3 --nproc "$nproc" > "$dir.log" 2>&1
  local code=$?
  local rows=0
  [[ -f "$dir/train/metrics.jsonl" ]] && rows=$(wc -l < "$dir/train/metrics.jsonl")
  local ok=1
  [[ $code == 0 && $rows == 3 && -f "$dir/train/checkpoints/step-3/manifest.json" ]] && ok=0
  if [[ $ok == 0 && $nproc -gt 1 ]]; then
    grep -q '"rng-1.pt"' "$dir/train/checkpoints/step-3/manifest.json" || ok=1
  fi
  result "toy-$name" "$ok" "(exit $code, $rows rows; $dir.log, $dir/trainer.log)"
}
toy_run torch-fp32 1
toy_run torch-bf16 1 SWERL_TRAINER__PRECISION=bf16
toy_run megatron-fp32 1 SWERL_TRAINER__BACKEND=megatron
toy_run megatron-bf16 1 SWERL_TRAINER__BACKEND=megatron SWERL_TRAINER__PRECISION=bf16
toy_run megatron-recompute 1 SWERL_TRAINER__BACKEND=megatron SWERL_TRAINER__ACTIVATION_CHECKPOINTING=true
if [[ "$GPUS" -ge 2 ]]; then
  toy_run torch-2ranks-nccl 2
  toy_run megatron-2stages-nccl 2 SWERL_TRAINER__BACKEND=megatron SWERL_TRAINER__MEGATRON__PIPELINE_PARALLEL=2
  toy_run megatron-2stages-bf16-nccl 2 SWERL_TRAINER__BACKEND=megatron SWERL_TRAINER__MEGATRON__PIPELINE_PARALLEL=2 SWERL_TRAINER__PRECISION=bf16
  toy_run megatron-cp2-nccl 2 SWERL_TRAINER__BACKEND=megatron SWERL_TRAINER__MEGATRON__CONTEXT_PARALLEL=2
else
  echo "SKIP toy-{torch-2ranks,megatron-2stages,megatron-2stages-bf16,megatron-cp2}-nccl (one GPU: NCCL needs a GPU per rank)"
fi

# 4. the trainer benchmark on the GPU
for precision in fp32 bf16; do
  timeout "$STEP_TIMEOUT" "$PY" bench/bench_trainer.py --device cuda --precision "$precision" --quick \
    --workdir "$WORK/bench" --json "$WORK/bench_trainer-$precision.json" \
    > "$WORK/bench_trainer-$precision.log" 2>&1
  result "bench-trainer-cuda-$precision" $? "($WORK/bench_trainer-$precision.log)"
done

exit $FAILED
