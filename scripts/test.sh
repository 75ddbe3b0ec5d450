#!/usr/bin/env bash
# Run the test phases of hypeman.vgpu. `scripts/test.sh all` runs every phase,
# keeps going after a failure so one run shows everything, and ends with a
# "summary: N passed, N failed, N skipped" line CI can read.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
repo=$(pwd)
coll="$repo/.collections/ansible_collections/hypeman/vgpu"
# Collections Galaxy cannot serve here (awx.awx, containers.podman) come from
# the cache scripts/bootstrap_molecule.sh fills from the ansible wheel.
export ANSIBLE_COLLECTIONS_PATH="$repo/.collections:${VGPU_SIM_CACHE:-/var/cache/hypeman-vgpu-sim}/collections-ansible-12.3.0"
export ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0 PY_COLORS=0

passed=0 failed=0 skipped=0 test_start=$(date +%s)
results=()
phase() { # name command...
  local name=$1 start rc; shift
  start=$(date +%s)
  printf '\n===== %s =====\n' "$name"
  "$@"; rc=$?
  local took=$(( $(date +%s) - start ))
  if [ "$rc" = 0 ]; then passed=$((passed + 1)); results+=("PASS  $name (${took}s)")
  else failed=$((failed + 1)); results+=("FAIL  $name (${took}s, exit $rc)"); fi
}
phase_wait() { # name pid log: the result of a phase started in the background
  local name=$1 pid=$2 log=$3 rc
  printf '\n===== %s (ran in the background; its output follows) =====\n' "$name"
  wait "$pid"; rc=$?
  cat "$log"
  local took=$(( $(date +%s) - molecule_start ))
  if [ "$rc" = 0 ]; then passed=$((passed + 1)); results+=("PASS  $name (${took}s, in the background)")
  else failed=$((failed + 1)); results+=("FAIL  $name (${took}s, in the background, exit $rc)"); fi
}
skip() { skipped=$((skipped + 1)); results+=("SKIP  $1: $2"); printf '\n===== %s: skipped (%s) =====\n' "$1" "$2"; }

in_venv() { # venv-dir command...: run inside the collection path with that venv first on PATH
  local venv=$1; shift
  (cd "$coll" && PATH="$venv/bin:$PATH" VIRTUAL_ENV="$venv" "$@")
}

# ansible-test wants its physical working directory to end in
# ansible_collections/hypeman/vgpu (it resolves symlinks), so it runs in a
# private mount namespace where the repo is bind-mounted at such a path.
# Without that privilege it falls back to a fresh copy of the tracked files.
ansible_test() { # venv-dir ansible-test-args...
  local venv=$1; shift
  local mnt="$repo/.mnt/ansible_collections/hypeman/vgpu"
  mkdir -p "$mnt"
  if unshare -m true 2>/dev/null; then
    # shellcheck disable=SC2016  # the inner script expands its own arguments
    PATH="$venv/bin:$PATH" VIRTUAL_ENV="$venv" unshare -m bash -c \
      'mount --bind "$1" "$2" && cd "$2" && shift 2 && exec ansible-test "$@"' _ "$repo" "$mnt" "$@"
  else
    echo "(no mount namespace here: testing a copy of the tracked files)"
    rm -rf "$mnt" && mkdir -p "$mnt"
    git ls-files -z -co --exclude-standard | xargs -0 cp --parents -t "$mnt" 2>/dev/null
    cp -a .git "$mnt/.git"
    (cd "$mnt" && PATH="$venv/bin:$PATH" VIRTUAL_ENV="$venv" ansible-test "$@")
  fi
}

sanity() { ansible_test "$1" sanity --venv --python "$2" --color no; }
units() { ansible_test "$1" units --venv --python "$2" --color no; }
integration() {
  local targets=()
  [ -n "${TARGET:-}" ] && read -r -a targets <<< "$TARGET"
  ansible_test "$1" integration --local --python "$2" --color no "${targets[@]}"
}
lint() { in_venv "$repo/.venv" ansible-lint --profile production --strict; }
changelog_lint() { in_venv "$repo/.venv" antsibull-changelog lint; }
build_smoke() { in_venv "$repo/.venv" bash "$repo/scripts/build_smoke.sh"; }

py312_all() {
  local v="$repo/.venv-py312"
  phase "sanity (py3.12, ansible-core 2.21)" sanity "$v" 3.12
  phase "units (py3.12, ansible-core 2.21)" units "$v" 3.12
  phase "integration (py3.12, ansible-core 2.21)" integration "$v" 3.12
}

main_venv="$repo/.venv"
case "${1:-all}" in
  sanity) phase "sanity" sanity "$main_venv" 3.11 ;;
  units) phase "units" units "$main_venv" 3.11 ;;
  integration) phase "integration" integration "$main_venv" 3.11 ;;
  lint) phase "ansible-lint (production)" lint ;;
  changelog-lint) phase "antsibull-changelog lint" changelog_lint ;;
  build-smoke) phase "build, install, ansible-doc" build_smoke ;;
  molecule) phase "molecule scenarios" bash "$repo/scripts/molecule.sh" ;;
  py312)
    if [ -x "$repo/.venv-py312/bin/python" ]; then py312_all; else skip "py3.12 matrix" "no python3.12 interpreter on this machine"; fi ;;
  all)
    # molecule spends most of its time waiting on containers and playbooks:
    # it runs beside the ansible-test phases (which share tests/output and
    # must stay one at a time), its output kept until it ends.
    mkdir -p "$repo/build"
    molecule_log="$repo/build/molecule.log"
    molecule_start=$(date +%s)
    MOLECULE_JOBS=${MOLECULE_JOBS:-2} bash "$repo/scripts/molecule.sh" > "$molecule_log" 2>&1 &
    molecule_pid=$!
    phase "sanity" sanity "$main_venv" 3.11
    phase "units" units "$main_venv" 3.11
    phase "integration" integration "$main_venv" 3.11
    phase "ansible-lint (production)" lint
    phase "antsibull-changelog lint" changelog_lint
    phase "build, install, ansible-doc" build_smoke
    if [ -x "$repo/.venv-py312/bin/python" ]; then py312_all
    else skip "py3.12 matrix" "no python3.12 interpreter on this machine"; fi
    phase_wait "molecule scenarios" "$molecule_pid" "$molecule_log"
    ;;
  *) echo "usage: $0 all|sanity|units|integration|lint|changelog-lint|build-smoke|molecule|py312" >&2; exit 2 ;;
esac

printf '\n===== results =====\n'
echo "total: $(( $(date +%s) - test_start ))s"
printf '%s\n' "${results[@]}"
echo "summary: $passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
