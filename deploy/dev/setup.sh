#!/usr/bin/env bash
# Idempotent, cached set-up of everything swerl needs on one Debian machine (CPU only):
#   system packages, the Python 3.12 environment, the tiny model, the private Docker engine and
#   the sandbox images. Each step is skipped when its result is already there, so reruns take
#   seconds. Usage: deploy/dev/setup.sh [all|system|python|launcher|model|docker|images]
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
CACHE=${SWERL_CACHE_DIR:-$HOME/.cache/swerl}
mkdir -p "$CACHE"
log() { printf '\033[1;34m[setup]\033[0m %s\n' "$*"; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

step_system() {
  local missing=()
  command -v redis-server >/dev/null || missing+=(redis-server)
  command -v dockerd >/dev/null || missing+=(docker.io)
  # compose.yaml (docs/deploy.md); v1.29 is what Debian 12 packages, the file stays in the
  # subset v1.29 and `docker compose` v2 share (deploy/compose_lint.py)
  command -v docker-compose >/dev/null || missing+=(docker-compose)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  command -v bwrap >/dev/null || missing+=(bubblewrap)
  command -v prlimit >/dev/null || missing+=(util-linux)
  command -v ip >/dev/null || missing+=(iproute2)
  command -v git >/dev/null || missing+=(git)
  if [ ${#missing[@]} -eq 0 ]; then log "system packages present"; return; fi
  log "installing system packages: ${missing[*]}"
  as_root apt-get update -q
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
}

find_python312() {
  if command -v pyenv >/dev/null && [ -x "$(pyenv root)/versions/3.12.1/bin/python3.12" ]; then
    echo "$(pyenv root)/versions/3.12.1/bin/python3.12"; return
  fi
  command -v python3.12 || { echo "Python 3.12 not found (install it or pyenv 3.12.1)" >&2; exit 1; }
}

step_python() {
  # The venv lives in the cache, keyed by the dependency files, and .venv links to it: a fresh
  # clone (CI) reuses it instead of reinstalling torch.
  local key venv py
  py=$(find_python312)
  # Keyed by what gets installed (not by the rest of pyproject.toml): reruns and fresh clones
  # with the same dependencies reuse the environment.
  key=$( { "$py" deploy/dev/requirements_from_pyproject.py dev
           "$py" deploy/dev/requirements_from_pyproject.py --no-deps
           cat constraints.txt; } | sha256sum | cut -c1-16)
  venv="$CACHE/venv-py312-$key"
  if [ ! -f "$venv/.swerl-ok" ]; then
    log "creating Python environment $venv (first time: several minutes, torch is large)"
    rm -rf "$venv"
    "$py" -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" install -q -c constraints.txt -r <("$venv/bin/python" deploy/dev/requirements_from_pyproject.py dev)
    "$venv/bin/pip" install -q --no-deps -r <("$venv/bin/python" deploy/dev/requirements_from_pyproject.py --no-deps)
    touch "$venv/.swerl-ok"
  else
    log "Python environment cached ($venv)"
  fi
  if [ -L .venv ] || [ ! -e .venv ]; then ln -sfn "$venv" .venv; fi
  step_launcher
}

step_launcher() {
  # .venv/bin/swerl: runs the CLI of the checkout it is called in, else of this one (swerl.sh)
  local bin
  bin=$(cd .venv/bin && pwd -P)
  sed -e "s|@ROOT@|$ROOT|g" -e "s|@PYTHON@|$bin/python|g" deploy/dev/swerl.sh > "$bin/swerl.tmp"
  chmod 755 "$bin/swerl.tmp" && mv -f "$bin/swerl.tmp" "$bin/swerl"
}

step_model() {
  if [ -f "$CACHE/tiny-model/config.json" ] && [ -f "$CACHE/tiny-model-coder/config.json" ] \
    && [ -f "$CACHE/tiny-model-moe/config.json" ] \
    && [ -f "$CACHE/tiny-model-toy-v2/swerl_warm_start.json" ]; then
    log "tiny models cached"; return
  fi
  log "building the tiny models"
  [ -f "$CACHE/tiny-model/config.json" ] \
    || .venv/bin/python -m services.tiny_model.build "$CACHE/tiny-model"
  [ -f "$CACHE/tiny-model-coder/config.json" ] \
    || .venv/bin/python -m services.tiny_model.build "$CACHE/tiny-model-coder" --coder
  [ -f "$CACHE/tiny-model-moe/config.json" ] \
    || .venv/bin/python -m services.tiny_model.build "$CACHE/tiny-model-moe" --moe
  # The toy task's format warm-start of tiny-model (docs/toy-task.md; ~40 CPU-seconds).
  [ -f "$CACHE/tiny-model-toy-v2/swerl_warm_start.json" ] \
    || .venv/bin/python -m services.tiny_model.warm_start "$CACHE/tiny-model-toy-v2"
}

step_docker() { deploy/dev/dockerd.sh start; }

step_images() { .venv/bin/python -m sandbox_worker.images build; }

what=${1:-all}
case "$what" in
  all) step_system; step_python; step_model; step_docker; step_images ;;
  system|python|launcher|model|docker|images) "step_$what" ;;
  *) echo "usage: $0 [all|system|python|launcher|model|docker|images]" >&2; exit 2 ;;
esac
