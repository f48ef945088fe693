#!/usr/bin/env bash
# Build the sandbox base image `swerl/base:bookworm` without any container registry.
#
#   debootstrap --variant=minbase bookworm  ->  cached root filesystem dir
#   tar of that dir                          ->  cached tarball
#   docker import                            ->  swerl/base:bookworm
#
# Why debootstrap + import: no container registry is reachable from dev/CI machines, but the
# Debian package repository is (debootstrap's default, so no mirror argument is given and no host
# name is written here). The same root filesystem dir is the bwrap backend's base, so both
# backends run exactly the same userland.
#
# Idempotent and cached: each stage is skipped when its output exists (the image in the engine,
# the tarball, the debootstrap dir with its completion stamp). FORCE=1 rebuilds everything.
# Environment: DOCKER_HOST (default the private dev engine), SWERL_CACHE (default /var/cache/swerl),
# SWERL_BASE_IMAGE (default swerl/base:bookworm), SWERL_SUITE (default bookworm).
set -euo pipefail

export DOCKER_HOST="${DOCKER_HOST:-unix:///run/swerl/docker.sock}"
CACHE="${SWERL_CACHE:-/var/cache/swerl}"
SUITE="${SWERL_SUITE:-bookworm}"
IMAGE="${SWERL_BASE_IMAGE:-swerl/base:${SUITE}}"
ROOTFS="${CACHE}/rootfs/base-${SUITE}"
TARBALL="${CACHE}/base-${SUITE}.tar"
STAMP="${ROOTFS}.done"
# Everything an instance image and the reward evaluation need; keep in sync with
# docs/sandboxes.md. bash/procps are in minbase already but listed to make the contract explicit.
PACKAGES="python3,python3-pytest,python3-venv,git,patch,ca-certificates,procps,bash"

log() { echo "build_base: $*" >&2; }

if [[ "${FORCE:-0}" == "1" ]]; then
  log "FORCE=1: removing cached stages"
  docker image rm -f "$IMAGE" >/dev/null 2>&1 || true
  rm -rf "$ROOTFS" "$TARBALL" "$STAMP"
fi

if docker image inspect "$IMAGE" >/dev/null 2>&1 && [[ -f "$STAMP" ]]; then
  log "image ${IMAGE} and rootfs ${ROOTFS} present: nothing to do"
  exit 0
fi

mkdir -p "${CACHE}/rootfs"

if [[ ! -f "$STAMP" ]]; then
  command -v debootstrap >/dev/null || { log "debootstrap missing (apt-get install debootstrap)"; exit 1; }
  log "debootstrap ${SUITE} -> ${ROOTFS} (this downloads ~60 MB of packages)"
  rm -rf "$ROOTFS" "$TARBALL"
  # The image must be the import of *this* tree (the bwrap backend uses the tree directly), so
  # an image imported from an earlier tree is dropped; instance images are rebuilt because
  # their content hash includes the base image id.
  docker image rm -f "$IMAGE" >/dev/null 2>&1 || true
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS"
  # Trim what a sandbox never needs; keep the image small and the export fast.
  rm -rf "${ROOTFS}/var/cache/apt/archives/"*.deb "${ROOTFS}/var/lib/apt/lists/"*
  # Reproducible identity for git inside sandboxes (commits made by the evaluation/reset).
  cat >"${ROOTFS}/etc/gitconfig" <<'EOF'
[user]
	name = swerl
	email = swerl@localhost
[safe]
	directory = *
[init]
	defaultBranch = main
EOF
  # Mount points the backends bind over; they must exist in the read-only root filesystem.
  mkdir -p "${ROOTFS}/testbed" "${ROOTFS}/swerl"
  date -Is >"$STAMP"
fi

if [[ ! -f "$TARBALL" ]]; then
  log "packing ${TARBALL}"
  tar --numeric-owner --xattrs -C "$ROOTFS" -cf "${TARBALL}.tmp" .
  mv "${TARBALL}.tmp" "$TARBALL"
fi

if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
  log "docker import -> ${IMAGE}"
  docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'WORKDIR /testbed' \
    --change 'CMD ["/bin/bash"]' \
    --change "LABEL swerl.owner=swerl swerl.kind=base swerl.suite=${SUITE}" \
    "$TARBALL" "$IMAGE" >/dev/null
fi
log "done: ${IMAGE}"
