#!/usr/bin/env bash
# A private Docker engine for development and tests: `dockerd.sh start|stop|status|restart`.
#
# Why private: the dev/CI machine has no system dockerd, no registry and no iptables. This
# daemon runs with no bridge and no iptables (sandboxes use network mode "none" anyway), its own
# data root and its own socket, so it never collides with another engine on the host.
# Everything in swerl talks to it through DOCKER_HOST=unix:///run/swerl/docker.sock (the default
# of sandbox_worker.backends.docker). Idempotent: `start` on a running daemon only checks it.
set -euo pipefail

RUN_DIR="${SWERL_DOCKER_RUN_DIR:-/run/swerl}"
SOCK="${SWERL_DOCKER_SOCK:-${RUN_DIR}/docker.sock}"
PIDFILE="${SWERL_DOCKER_PIDFILE:-${RUN_DIR}/docker.pid}"
EXEC_ROOT="${SWERL_DOCKER_EXEC_ROOT:-${RUN_DIR}/docker-exec}"
DATA_ROOT="${SWERL_DOCKER_DATA_ROOT:-/var/lib/swerl/docker}"
LOG="${SWERL_DOCKER_LOG:-/var/log/swerl-dockerd.log}"
START_TIMEOUT_S="${SWERL_DOCKER_START_TIMEOUT_S:-60}"

export DOCKER_HOST="unix://${SOCK}"

die() { echo "dockerd.sh: $*" >&2; exit 1; }

pid_alive() {
  [[ -f "$PIDFILE" ]] || return 1
  local pid
  pid="$(cat "$PIDFILE" 2>/dev/null || true)"
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null
}

responding() {
  # `docker version` needs both the client and the daemon; quiet and bounded.
  timeout 5 docker version --format '{{.Server.Version}}' >/dev/null 2>&1
}

cmd_status() {
  if pid_alive && responding; then
    echo "running pid=$(cat "$PIDFILE") socket=${SOCK}"
    return 0
  fi
  if pid_alive; then
    echo "starting-or-hung pid=$(cat "$PIDFILE") socket=${SOCK}"
    return 2
  fi
  echo "stopped"
  return 3
}

cmd_start() {
  command -v dockerd >/dev/null || die "dockerd not installed (apt-get install docker.io)"
  command -v docker >/dev/null || die "docker client not installed"
  if pid_alive && responding; then
    echo "already running pid=$(cat "$PIDFILE")"
    return 0
  fi
  if ! pid_alive; then
    mkdir -p "$RUN_DIR" "$DATA_ROOT" "$EXEC_ROOT" "$(dirname "$LOG")"
    # A stale socket or pid file from a killed daemon blocks the next start.
    rm -f "$SOCK" "$PIDFILE"
    echo "=== $(date -Is) starting dockerd" >>"$LOG"
    setsid dockerd \
      --iptables=false --bridge=none \
      --storage-driver=overlay2 \
      --data-root "$DATA_ROOT" \
      --exec-root "$EXEC_ROOT" \
      --pidfile "$PIDFILE" \
      -H "unix://${SOCK}" \
      >>"$LOG" 2>&1 </dev/null &
  fi
  local deadline=$((SECONDS + START_TIMEOUT_S))
  while ((SECONDS < deadline)); do
    if responding; then
      echo "started pid=$(cat "$PIDFILE") socket=${SOCK}"
      return 0
    fi
    sleep 0.5
  done
  tail -n 30 "$LOG" >&2 || true
  die "dockerd did not become ready within ${START_TIMEOUT_S}s (log: ${LOG})"
}

cmd_stop() {
  if ! pid_alive; then
    rm -f "$PIDFILE"
    echo "not running"
    return 0
  fi
  local pid
  pid="$(cat "$PIDFILE")"
  kill -TERM "$pid"
  local deadline=$((SECONDS + 30))
  while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
    sleep 0.5
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "dockerd did not stop in 30s, sending KILL" >&2
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$PIDFILE" "$SOCK"
  echo "stopped"
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  restart) cmd_stop; cmd_start ;;
  *) echo "usage: $0 start|stop|status|restart" >&2; exit 64 ;;
esac
