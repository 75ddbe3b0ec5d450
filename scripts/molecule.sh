#!/usr/bin/env bash
# Run molecule scenarios on the simulated vGPU host, one after another.
#   scripts/molecule.sh [scenario ...]    (default: every extensions/molecule/*/molecule.yml)
# Builds (or reuses) the cached image, then per scenario runs
# syntax, create, prepare, converge, idempotence, verify, destroy as separate
# molecule steps so each is timed; whatever happens, the scenario's containers
# are destroyed. Prints a table of phase times and a summary line.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

bash scripts/bootstrap_molecule.sh >&2 || exit 1
# shellcheck source=scripts/molecule_env.sh
. scripts/molecule_env.sh

t0=$(date +%s)
VGPU_SIM_IMAGE=$(bash scripts/sim_image.sh) || { echo "image build failed" >&2; exit 1; }
export VGPU_SIM_IMAGE
image_time=$(( $(date +%s) - t0 ))

if [ "$#" -gt 0 ]; then
  scenarios=("$@")
else
  mapfile -t scenarios < <(cd extensions/molecule && for f in */molecule.yml; do dirname "$f"; done)
fi

containers_of() { # scenario -> platform (container) names
  "$VIRTUAL_ENV/bin/python" -c 'import sys, yaml
for p in yaml.safe_load(open(sys.argv[1])).get("platforms", []): print(p["name"])' \
    "extensions/molecule/$1/molecule.yml"
}

current=""
cleanup() {
  [ -n "$current" ] || return 0
  molecule destroy -s "$current" >/dev/null 2>&1
  local name
  for name in $(containers_of "$current"); do
    podman container exists "$name" 2>/dev/null && podman rm -f "$name" >/dev/null 2>&1
  done
  current=""
}
trap 'cleanup; exit 130' INT TERM
trap cleanup EXIT

rows=() passed=0 failed=0
total_start=$(date +%s)
for scenario in "${scenarios[@]}"; do
  current=$scenario
  status=PASS times=()
  cleanup_needed=1
  current=$scenario
  molecule destroy -s "$scenario" >/dev/null 2>&1  # leftovers of an interrupted run
  for phase in syntax create prepare converge idempotence verify destroy; do
    start=$(date +%s)
    printf '\n===== molecule %s: %s =====\n' "$scenario" "$phase"
    if molecule "$phase" -s "$scenario"; then
      times+=("$phase $(( $(date +%s) - start ))s")
    else
      times+=("$phase FAILED after $(( $(date +%s) - start ))s")
      status=FAIL
      break
    fi
  done
  [ "$status" = PASS ] && cleanup_needed=0
  [ "$cleanup_needed" = 1 ] && cleanup
  current=""
  if [ "$status" = PASS ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
  rows+=("$status  $scenario: ${times[*]}")
done

printf '\n===== molecule results =====\n'
echo "image: ${image_time}s ($VGPU_SIM_IMAGE)"
printf '%s\n' "${rows[@]}"
echo "molecule total: $(( $(date +%s) - total_start ))s"
echo "molecule: $passed passed, $failed failed"
[ "$failed" = 0 ]
