#!/usr/bin/env bash
# Pre-pull the official SWE-bench instance images on a production node (ops script).
#
#   prepull_swebench.sh [options] INSTANCES
#
# INSTANCES is a file with one instance id per line (`#` comments allowed) or a SWE-bench-format
# JSONL file (one object with "instance_id" per line); `-` reads ids from stdin.
#
# Sandbox workers never pull at run time (`--pull=never`; a missing image is an `aborted` task),
# so every node must hold the images of the instances it may be given before training starts.
# Image names follow the SWE-bench harness (TestSpec.instance_image_key with a namespace):
#   <namespace>/sweb.eval.<arch>.<instance_id lower-cased, "__" -> "_1776_">:<tag>
# e.g. django__django-11099 -> swebench/sweb.eval.x86_64.django_1776_django-11099:latest
# (the same rule as sandbox_worker.images.instance_image; `--dry-run` prints the names).
#
# Options:
#   --namespace NS     image namespace (default: swebench)
#   --arch ARCH        x86_64 | arm64 (default: x86_64)
#   --tag TAG          image tag (default: latest)
#   --retries N        attempts per image (default: 4), with exponential backoff
#   --parallel N       concurrent pulls (default: 4)
#   --build-missing D  after pulling, build the images that could not be pulled with the SWE-bench
#                      harness (`python -m swebench.harness.prepare_images`, needs the `swebench`
#                      package and dataset D, e.g. SWE-bench/SWE-bench_Verified)
#   --split S          dataset split for --build-missing (default: test)
#   --missing-out F    write the ids still missing at the end to F (default: ./missing_images.txt)
#   --dry-run          print the image names and whether each is present; pull nothing
# Environment: PREPULL_BACKOFF_S, the first retry delay in seconds (default 5, doubled each retry).
#
# Exit status: 0 if every image is present at the end, 1 if some are missing (listed on stderr
# and in --missing-out), 2 on usage errors. DOCKER_HOST selects the engine (the node's engine,
# not the private dev engine, unless you set it so).
set -euo pipefail

NAMESPACE=swebench
ARCH=x86_64
TAG=latest
RETRIES=4
PARALLEL=4
BUILD_DATASET=""
SPLIT=test
MISSING_OUT=./missing_images.txt
DRY_RUN=0
INPUT=""

usage() { sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

while (($#)); do
  case "$1" in
    --namespace) NAMESPACE="${2:?}"; shift 2 ;;
    --arch) ARCH="${2:?}"; shift 2 ;;
    --tag) TAG="${2:?}"; shift 2 ;;
    --retries) RETRIES="${2:?}"; shift 2 ;;
    --parallel) PARALLEL="${2:?}"; shift 2 ;;
    --build-missing) BUILD_DATASET="${2:?}"; shift 2 ;;
    --split) SPLIT="${2:?}"; shift 2 ;;
    --missing-out) MISSING_OUT="${2:?}"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage ;;
    -*) [[ "$1" == "-" ]] && { INPUT="-"; shift; continue; }; echo "unknown option $1" >&2; usage ;;
    *) [[ -z "$INPUT" ]] || { echo "only one INSTANCES file" >&2; usage; }; INPUT="$1"; shift ;;
  esac
done
[[ -n "$INPUT" ]] || { echo "missing INSTANCES file" >&2; usage; }
[[ "$ARCH" == x86_64 || "$ARCH" == arm64 ]] || { echo "bad --arch $ARCH" >&2; exit 2; }
[[ "$RETRIES" =~ ^[1-9][0-9]*$ && "$PARALLEL" =~ ^[1-9][0-9]*$ ]] || { echo "bad number" >&2; exit 2; }

read_ids() {
  local src="$1"
  if [[ "$src" == "-" ]]; then src=/dev/stdin; fi
  [[ -r "$src" ]] || { echo "cannot read $src" >&2; exit 2; }
  # JSONL lines carry "instance_id"; plain lines are ids.
  sed -e 's/#.*$//' -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' "$src" | while IFS= read -r line; do
    [[ -z "$line" ]] && continue
    if [[ "$line" == \{* ]]; then
      id="$(printf '%s' "$line" | sed -n 's/.*"instance_id"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p')"
      [[ -n "$id" ]] || { echo "no instance_id in line: ${line:0:80}" >&2; exit 2; }
      printf '%s\n' "$id"
    else
      printf '%s\n' "$line"
    fi
  done
}

image_name() {
  local id="$1"
  [[ "$id" =~ ^[A-Za-z0-9][A-Za-z0-9_.-]*$ ]] || { echo "invalid instance id: $id" >&2; return 2; }
  local name="${id,,}"
  name="${name//__/_1776_}"
  printf '%s/sweb.eval.%s.%s:%s\n' "$NAMESPACE" "$ARCH" "$name" "$TAG"
}

present() { docker image inspect "$1" >/dev/null 2>&1; }

pull_one() {
  local image="$1" attempt delay="${PREPULL_BACKOFF_S:-5}"
  for ((attempt = 1; attempt <= RETRIES; attempt++)); do
    if present "$image"; then echo "present $image"; return 0; fi
    if docker pull --quiet "$image" >/dev/null 2>&1; then echo "pulled  $image"; return 0; fi
    if ((attempt < RETRIES)); then
      echo "retry   $image (attempt $attempt failed, waiting ${delay}s)" >&2
      sleep "$delay"; delay=$((delay * 2))
    fi
  done
  echo "MISSING $image" >&2
  return 1
}
export -f pull_one present
export RETRIES PREPULL_BACKOFF_S

ids_text="$(read_ids "$INPUT")"
mapfile -t IDS <<<"$ids_text"
[[ -n "$ids_text" ]] || IDS=()
((${#IDS[@]})) || { echo "no instance ids in $INPUT" >&2; exit 2; }
declare -A IMAGE_OF=()
for id in "${IDS[@]}"; do IMAGE_OF["$id"]="$(image_name "$id")" || exit 2; done

if ((DRY_RUN)); then
  for id in "${IDS[@]}"; do
    if present "${IMAGE_OF[$id]}" 2>/dev/null; then state=present; else state=absent; fi
    printf '%s\t%s\t%s\n' "$id" "${IMAGE_OF[$id]}" "$state"
  done
  exit 0
fi

command -v docker >/dev/null || { echo "docker client not found" >&2; exit 2; }
printf '%s\n' "${IMAGE_OF[@]}" | sort -u | xargs -r -P "$PARALLEL" -I{} bash -c 'pull_one "$1"' _ {} || true

missing=()
for id in "${IDS[@]}"; do present "${IMAGE_OF[$id]}" || missing+=("$id"); done

if ((${#missing[@]})) && [[ -n "$BUILD_DATASET" ]]; then
  echo "building ${#missing[@]} missing images with the SWE-bench harness" >&2
  python -m swebench.harness.prepare_images --dataset_name "$BUILD_DATASET" --split "$SPLIT" \
    --instance_ids "${missing[@]}" --namespace "$NAMESPACE" --tag "$TAG" --arch "$ARCH" \
    --max_workers "$PARALLEL" || echo "prepare_images failed" >&2
  still=()
  for id in "${missing[@]}"; do present "${IMAGE_OF[$id]}" || still+=("$id"); done
  missing=("${still[@]}")
fi

: >"$MISSING_OUT"
if ((${#missing[@]})); then
  printf '%s\n' "${missing[@]}" >"$MISSING_OUT"
  echo "prepull: ${#missing[@]} of ${#IDS[@]} images missing (ids in $MISSING_OUT):" >&2
  for id in "${missing[@]}"; do echo "  $id -> ${IMAGE_OF[$id]}" >&2; done
  exit 1
fi
echo "prepull: all ${#IDS[@]} images present"
