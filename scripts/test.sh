#!/usr/bin/env bash
# Run the test phases of hypeman.vgpu. `scripts/test.sh all` runs every phase,
# keeps going after a failure so one run shows everything, and ends with each
# phase's wall and CPU time and a "summary: N passed, N failed, N skipped"
# line CI can read.
#
# `all` runs three lanes at the same time (each phase waits on playbooks,
# containers and pip as much as it computes, so one lane alone leaves CPUs
# idle): the ansible-test phases on Python 3.11 (output streamed), the same on
# Python 3.12, and the molecule scenarios; the last two print their output
# when they end. Each lane's ansible-test has its own tests/output and
# integration inventory (see ansible_test). Molecule runs MOLECULE_JOBS (2)
# scenarios at a time, MOLECULE_JOBS_LATE (3) once the other lanes have ended.
# TEST_LANES=1 runs the lanes one after another instead.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
repo=$(pwd)
coll="$repo/.collections/ansible_collections/hypeman/vgpu"
# Collections Galaxy cannot serve here (awx.awx, containers.podman) come from
# the cache scripts/bootstrap_molecule.sh fills from the ansible wheel.
export ANSIBLE_COLLECTIONS_PATH="$repo/.collections:${VGPU_SIM_CACHE:-/var/cache/hypeman-vgpu-sim}/collections-ansible-12.3.0"
export ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0 PY_COLORS=0

test_start=$(date +%s)
results_dir=$(mktemp -d)
trap 'rm -rf "$results_dir"' EXIT
results_file="$results_dir/main.tsv"  # each lane writes its own

cpu_seconds() { # the children line of `times` on stdin -> user+sys seconds
  sed -n 2p | awk '{ t = 0; for (i = 1; i <= 2; i++) { split($i, p, /[ms]/); t += p[1] * 60 + p[2] } printf "%d", t + 0.5 }'
}
phase() { # name command...: run one phase, record its result, wall and CPU time
  local name=$1 start rc took cpu times_file; shift
  start=$(date +%s)
  printf '\n===== %s =====\n' "$name"
  # CPU time: user+sys of every process the phase waited for (processes
  # inside molecule's containers are children of podman's conmon, not counted).
  times_file=$(mktemp -p "$results_dir")
  ( "$@"; rc=$?; times > "$times_file"; exit "$rc" ); rc=$?
  took=$(( $(date +%s) - start ))
  cpu=$(cpu_seconds < "$times_file")
  printf '%s\t%s\t%s\t%s\t%s\n' "$([ "$rc" = 0 ] && echo PASS || echo FAIL)" "$name" "$took" "${cpu:-?}" "$rc" >> "$results_file"
  printf '===== %s: exit %s, %ss wall, %ss CPU =====\n' "$name" "$rc" "$took" "${cpu:-?}"
}
skip() { printf 'SKIP\t%s\t%s\n' "$1" "$2" >> "$results_file"; printf '\n===== %s: skipped (%s) =====\n' "$1" "$2"; }

in_venv() { # venv-dir command...: run inside the collection path with that venv first on PATH
  local venv=$1; shift
  (cd "$coll" && PATH="$venv/bin:$PATH" VIRTUAL_ENV="$venv" "$@")
}

# ansible-test wants its physical working directory to end in
# ansible_collections/hypeman/vgpu (it resolves symlinks), so it runs in a
# private mount namespace where the repo is bind-mounted at such a path.
# Without that privilege it falls back to a fresh copy of the tracked files.
# A lane other than the Python 3.11 one (TEST_LANE set) gets its own tests/output and
# tests/integration/inventory (ansible-test rewrites it per target with the
# lane's interpreter), bind-mounted over the repo's inside the namespace, so
# lanes run at the same time without touching each other's files.
ansible_test() { # venv-dir ansible-test-args...
  local venv=$1; shift
  local lane=${TEST_LANE:-} mnt out="" inv=""
  mnt="$repo/.mnt/${lane:+$lane/}ansible_collections/hypeman/vgpu"
  mkdir -p "$mnt"
  if unshare -m true 2>/dev/null; then
    if [ -n "$lane" ]; then
      out="$repo/.mnt/$lane-output" inv="$repo/.mnt/$lane-inventory"
      mkdir -p "$out" "$repo/tests/output" && touch "$inv" "$repo/tests/integration/inventory"
    fi
    # shellcheck disable=SC2016  # the inner script expands its own arguments
    PATH="$venv/bin:$PATH" VIRTUAL_ENV="$venv" unshare -m bash -c '
      mount --bind "$1" "$2" || exit 1
      if [ -n "$3" ]; then
        mount --bind "$3" "$2/tests/output" && mount --bind "$4" "$2/tests/integration/inventory" || exit 1
      fi
      cd "$2" && shift 4 && exec ansible-test "$@"' _ "$repo" "$mnt" "$out" "$inv" "$@"
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

main_venv="$repo/.venv" py312_venv="$repo/.venv-py312"
have_py312() { [ -x "$py312_venv/bin/python" ]; }
lane_py311() {
  phase "sanity" sanity "$main_venv" 3.11
  phase "units" units "$main_venv" 3.11
  phase "integration" integration "$main_venv" 3.11
}
lane_py312() {
  if ! have_py312; then skip "py3.12 matrix" "no python3.12 interpreter on this machine"; return; fi
  phase "sanity (py3.12, ansible-core 2.21)" sanity "$py312_venv" 3.12
  phase "units (py3.12, ansible-core 2.21)" units "$py312_venv" 3.12
  phase "integration (py3.12, ansible-core 2.21)" integration "$py312_venv" 3.12
}
browser_check() { # the HTML fleet report in headless Chromium (docs/testing.md)
  PYTHONPATH="$repo/.collections" "$main_venv/bin/python" "$repo/tests/browser/check_report.py" --build "$repo/build"
}
lane_checks() {
  phase "ansible-lint (production)" lint
  phase "antsibull-changelog lint" changelog_lint
  phase "build, install, ansible-doc" build_smoke
  phase "EDA rulebook run" bash "$repo/tests/eda/rulebook_run.sh"
  phase "fleet report in Chromium" browser_check
}
lane_molecule() { MOLECULE_JOBS=${MOLECULE_JOBS:-2} phase "molecule scenarios" bash "$repo/scripts/molecule.sh"; }

lane_run() { # name function...: the lane's phases in a subshell; records its wall and CPU time
  local name=$1; shift
  # The Python 3.11 lane keeps the repo's tests/output (where people look).
  ( results_file="$results_dir/$name.tsv"; [ "$name" = py311 ] || TEST_LANE=$name; SECONDS=0
    for fn in "$@"; do $fn; done
    took=$SECONDS; times > "$results_dir/$name.times"
    printf '%s\t%s\n' "$took" "$(cpu_seconds < "$results_dir/$name.times")" > "$results_dir/$name.lane" )
}
# Background lanes: name -> pid; output in build/test-lanes/<name>.log.
declare -A lane_pids=()
lane_start() { # name function
  local name=$1 fn=$2
  mkdir -p "$repo/build/test-lanes"
  lane_run "$name" "$fn" > "$repo/build/test-lanes/$name.log" 2>&1 &
  lane_pids[$name]=$!
}
lane_wait() { # name: wait for a background lane and print its output
  local name=$1
  wait "${lane_pids[$name]}"
  printf '\n===== lane %s (ran in the background; its output follows) =====\n' "$name"
  cat "$repo/build/test-lanes/$name.log"
}

case "${1:-all}" in
  sanity) phase "sanity" sanity "$main_venv" 3.11 ;;
  units) phase "units" units "$main_venv" 3.11 ;;
  integration) phase "integration" integration "$main_venv" 3.11 ;;
  lint) phase "ansible-lint (production)" lint ;;
  changelog-lint) phase "antsibull-changelog lint" changelog_lint ;;
  build-smoke) phase "build, install, ansible-doc" build_smoke ;;
  molecule) phase "molecule scenarios" bash "$repo/scripts/molecule.sh" ;;
  eda) phase "EDA rulebook run" bash "$repo/tests/eda/rulebook_run.sh" ;;
  browser) phase "fleet report in Chromium" browser_check ;;
  py312) lane_py312 ;;
  all)
    if [ "${TEST_LANES:-3}" -le 1 ]; then
      lane_py311; lane_checks; lane_py312; lane_molecule
    else
      # The longest lane (molecule) first; the Python 3.11 lane streams its
      # output; the short checks follow it.
      export MOLECULE_JOBS_FILE="$results_dir/molecule.jobs"
      lane_start molecule lane_molecule
      lane_start py312 lane_py312
      lane_main=1
      lane_run py311 lane_py311 lane_checks
      lane_wait py312
      # The ansible-test lanes are done: molecule may start more scenarios at once.
      echo "${MOLECULE_JOBS_LATE:-3}" > "$MOLECULE_JOBS_FILE"
      lane_wait molecule
    fi
    ;;
  *) echo "usage: $0 all|sanity|units|integration|lint|changelog-lint|build-smoke|molecule|eda|browser|py312" >&2; exit 2 ;;
esac

# A lane that ended without recording its end (killed, crashed) is a failure.
for name in "${!lane_pids[@]}" ${lane_main:+py311}; do
  [ -e "$results_dir/$name.lane" ] \
    || printf 'FAIL\tlane %s: did not finish\t?\t?\t?\n' "$name" >> "$results_dir/main.tsv"
done
passed=0 failed=0 skipped=0
printf '\n===== results =====\n'
echo "total: $(( $(date +%s) - test_start ))s wall"
for lane_file in "$results_dir"/*.lane; do
  [ -e "$lane_file" ] || continue
  IFS=$'\t' read -r took cpu < "$lane_file"
  printf 'lane %-8s %5ss wall %5ss CPU\n' "$(basename "$lane_file" .lane)" "$took" "$cpu"
done
for tsv in "$results_dir"/main.tsv "$results_dir"/py311.tsv "$results_dir"/py312.tsv "$results_dir"/molecule.tsv; do
  [ -e "$tsv" ] || continue
  while IFS=$'\t' read -r status name took cpu rc; do
    case "$status" in
      PASS) passed=$((passed + 1)); printf 'PASS  %-42s %5ss wall %5ss CPU\n' "$name" "$took" "$cpu" ;;
      FAIL) failed=$((failed + 1)); printf 'FAIL  %-42s %5ss wall %5ss CPU  exit %s\n' "$name" "$took" "$cpu" "$rc" ;;
      SKIP) skipped=$((skipped + 1)); printf 'SKIP  %s: %s\n' "$name" "$took" ;;
    esac
  done < "$tsv"
done
[ -e "$repo/build/molecule-logs/summary.txt" ] && [ -e "$results_dir/molecule.tsv" ] && cat "$repo/build/molecule-logs/summary.txt"
echo "summary: $passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
