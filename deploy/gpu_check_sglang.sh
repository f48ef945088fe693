#!/usr/bin/env bash
# Check swerl's SGLang client against a REAL SGLang server (run on a GPU machine).
#
#   deploy/gpu_check_sglang.sh MODEL_DIR|tiny [PORT]
#
# Starts `python -m sglang.launch_server --model-path MODEL_DIR` on 127.0.0.1:PORT (default 30000),
# waits for /health, then (1) runs the client contract tests
# (tests/integration/adapter/engines/test_sglang_client.py) against it by setting SWERL_SGLANG_URL and
# SWERL_SGLANG_MODEL_DIR. The same tests run against the CPU reference engine when those variables
# are unset (plain `pytest tests/integration/adapter/engines`), so both servers are held to one contract.
# (2) Then it stops that server and runs `bench/bench_refresh.py --device cuda --quick`: two SGLang
# servers of the tiny model, step vs token refresh timings (issue 11), figures in the work dir.
#
# MODEL_DIR: a local Hugging Face model directory (e.g. a Qwen3-0.6B download), or `tiny` to build
# swerl's tiny random model here (python -m services.tiny_model.build).
#
# Environment:
#   PYTHON             python with swerl's test dependencies (default: .venv/bin/python)
#   SGLANG_PYTHON      python with `sglang` installed, i.e. `pip install -e '.[gpu]'` (default: PYTHON)
#   SGLANG_EXTRA_ARGS  extra launch_server arguments (default for `tiny`: --dtype bfloat16
#                      --attention-backend triton --disable-cuda-graph)
#   SGLANG_START_TIMEOUT  seconds to wait for /health (default 900)
#   SWERL_LONG_TOKENS  tokens of the "long" generation used by pause/abort tests (default 3000)
#   SWERL_SKIP_BENCH_REFRESH=1  skip step (2)
set -euo pipefail

usage() {
  sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

[[ $# -ge 1 && $# -le 2 ]] || usage
[[ "$1" == "-h" || "$1" == "--help" ]] && usage

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$REPO/.venv/bin/python}"
SGLANG_PY="${SGLANG_PYTHON:-$PY}"
PORT="${2:-30000}"
TIMEOUT="${SGLANG_START_TIMEOUT:-900}"
WORK=""
SERVER_PGID=""

cleanup() {
  if [[ -n "$SERVER_PGID" ]] && kill -0 -- "-$SERVER_PGID" 2>/dev/null; then
    echo "stopping SGLang (process group $SERVER_PGID)"
    kill -TERM -- "-$SERVER_PGID" 2>/dev/null || true
    for _ in $(seq 1 30); do
      kill -0 -- "-$SERVER_PGID" 2>/dev/null || break
      sleep 1
    done
    kill -KILL -- "-$SERVER_PGID" 2>/dev/null || true
  fi
  [[ -n "$WORK" ]] && echo "logs kept in $WORK"
  return 0
}
trap cleanup EXIT

[[ -x "$PY" ]] || { echo "error: $PY is not executable (set PYTHON=...)" >&2; exit 2; }
if ! "$SGLANG_PY" -c "import sglang" 2>/dev/null; then
  echo "error: sglang is not importable by $SGLANG_PY (install the gpu extra: pip install -e '.[gpu]'," \
       "or point SGLANG_PYTHON at an environment that has it)" >&2
  exit 2
fi
if ! [[ "$PORT" =~ ^[0-9]+$ ]] || (( PORT < 1 || PORT > 65535 )); then
  echo "error: PORT must be 1..65535, got $PORT" >&2
  exit 2
fi
if curl -fsS "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then
  echo "error: something already answers on port $PORT; pick another port" >&2
  exit 2
fi

WORK="$(mktemp -d -t swerl-gpu-check-XXXXXX)"
LOG="$WORK/sglang.log"
MODEL="$1"
if [[ "$MODEL" == "tiny" ]]; then
  (cd "$REPO" && "$PY" -m services.tiny_model.build "$WORK/tiny-model")
  MODEL="$WORK/tiny-model"
  EXTRA="${SGLANG_EXTRA_ARGS:---dtype bfloat16 --attention-backend triton --disable-cuda-graph}"
else
  EXTRA="${SGLANG_EXTRA_ARGS:-}"
fi
[[ -f "$MODEL/config.json" ]] || { echo "error: $MODEL has no config.json" >&2; exit 2; }
MODEL="$(cd "$MODEL" && pwd)"

echo "sglang $("$SGLANG_PY" -c 'import sglang; print(sglang.__version__)') serving $MODEL on :$PORT"
# setsid: the server and its scheduler/detokenizer children share one process group we can stop.
# shellcheck disable=SC2086
setsid "$SGLANG_PY" -m sglang.launch_server --model-path "$MODEL" --host 127.0.0.1 \
  --port "$PORT" $EXTRA >"$LOG" 2>&1 &
SERVER_PID=$!
SERVER_PGID="$SERVER_PID"

deadline=$((SECONDS + TIMEOUT))
until curl -fsS "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; do
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    echo "error: SGLang exited during start-up; last log lines:" >&2
    tail -n 40 "$LOG" >&2
    exit 1
  fi
  if (( SECONDS > deadline )); then
    echo "error: SGLang not healthy after ${TIMEOUT}s; last log lines:" >&2
    tail -n 40 "$LOG" >&2
    exit 1
  fi
  sleep 2
done
echo "SGLang is up; model_info: $(curl -fsS "http://127.0.0.1:$PORT/model_info" || true)"

cd "$REPO"
status=0
SWERL_SGLANG_URL="http://127.0.0.1:$PORT" SWERL_SGLANG_MODEL_DIR="$MODEL" \
  SWERL_LONG_TOKENS="${SWERL_LONG_TOKENS:-3000}" \
  "$PY" -m pytest tests/integration/adapter/engines/test_sglang_client.py -v -p no:cacheprovider \
  || status=$?
if (( status != 0 )); then
  echo "contract tests FAILED against SGLang (exit $status); server log: $LOG" >&2
else
  echo "contract tests passed against real SGLang"
fi

# 2. Refresh timings on real SGLang (issue 11): step vs token mode, two servers of the tiny model
#    on the GPU(s), after this server is stopped (it holds the GPU's memory).
if [[ "${SWERL_SKIP_BENCH_REFRESH:-0}" != 1 ]]; then
  cleanup
  SERVER_PGID=""
  bench=0
  env -u SGLANG_EXTRA_ARGS SGLANG_PYTHON="$SGLANG_PY" "$PY" bench/bench_refresh.py --device cuda \
    --quick --json "$WORK/bench_refresh.json" || bench=$?
  if (( bench != 0 )); then
    echo "bench_refresh --device cuda FAILED (exit $bench); logs in $WORK" >&2
    status=$bench
  else
    echo "bench_refresh --device cuda: figures in $WORK/bench_refresh.json"
  fi
fi
exit "$status"
