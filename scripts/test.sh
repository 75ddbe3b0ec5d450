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
# The machine's CPU counters (/proc/stat: busy and idle ticks of all CPUs) at
# the start; the summary says how busy the run kept the CPUs (idle time is
# room for more parallel work, none means only less work makes it faster).
cpu_ticks() { awk '$1 == "cpu" { printf "%d %d", $2 + $3 + $4 + $7 + $8, $5 + $6 }' /proc/stat 2>/dev/null; }
read -r busy_start idle_start <<< "$(cpu_ticks)"
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
    # Scratch in memory: inside the namespace /tmp is a private tmpfs, gone
    # when the phase ends. The unit tests build host trees by the thousand in
    # it; on the disk's journal that was two thirds of the unit phase's CPU, as
    # kernel time (docs/testing.md, "Scratch in memory").
    # A repo under /tmp is mounted back in place through a descriptor opened
    # before /tmp was covered (-c: mount must not resolve that path again).
    # An integration phase's marker there has the test venvs' interpreters compile each
    # source of an AnsiballZ payload once per phase, not twice per module run
    # (tests/harness/zipimport_compile_once.py; its code cache lives in that /tmp too).
    # shellcheck disable=SC2016  # the inner script expands its own arguments
    PATH="$venv/bin:$PATH" VIRTUAL_ENV="$venv" unshare -m bash -c '
      real=$(realpath "$1") && exec 9< "$real" || exit 1
      mount -t tmpfs -o mode=1777 hypeman-vgpu-tmp /tmp || exit 1
      if [ "$5" = integration ]; then : > /tmp/.hypeman-vgpu-zipimport-compile-once || exit 1; fi
      case "$real/" in
        /tmp/*) mkdir -p "$real" && mount -c --bind /proc/self/fd/9 "$real" || exit 1 ;;
      esac
      exec 9<&-
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
integration() { # venv python [target...]: the targets given, else $TARGET's, else every target
  local venv=$1 python=$2 targets=(); shift 2
  targets=("$@")
  [ "${#targets[@]}" -eq 0 ] && [ -n "${TARGET:-}" ] && read -r -a targets <<< "$TARGET"
  [ "${#targets[@]}" -gt 0 ] && echo "targets: ${targets[*]}"
  ansible_test "$venv" integration --local --python "$python" --color no "${targets[@]}"
}
lint() { in_venv "$repo/.venv" ansible-lint --profile production --strict; }
changelog_lint() { in_venv "$repo/.venv" antsibull-changelog lint; }
build_smoke() { in_venv "$repo/.venv" bash "$repo/scripts/build_smoke.sh"; }

main_venv="$repo/.venv" py312_venv="$repo/.venv-py312"
have_py312() { [ -x "$py312_venv/bin/python" ]; }
# matrix_phase name function python: a phase on Python 3.11 (ansible-core 2.19) or 3.12 (2.21)
matrix_phase() {
  local name=$1 fn=$2 python=$3; shift 3
  if [ "$python" = 3.11 ]; then phase "$name" "$fn" "$main_venv" 3.11 "$@"; return; fi
  if ! have_py312; then skip "$name (py3.12)" "no python3.12 interpreter on this machine"; return; fi
  phase "$name (py3.12, ansible-core 2.21)" "$fn" "$py312_venv" 3.12 "$@"
}
browser_check() { # the HTML fleet report in headless Chromium (docs/testing.md)
  PYTHONPATH="$repo/.collections" "$main_venv/bin/python" "$repo/tests/browser/check_report.py" --build "$repo/build"
}
checks() {
  phase "ansible-lint (production)" lint
  phase "antsibull-changelog lint" changelog_lint
  phase "build, install, ansible-doc" build_smoke
  phase "EDA rulebook run" bash "$repo/tests/eda/rulebook_run.sh"
  phase "fleet report in Chromium" browser_check
}
molecule_all() { phase "molecule scenarios" bash "$repo/scripts/molecule.sh"; }

# --- integration chunks ---------------------------------------------------------
# `all` splits each Python's integration targets into INTEGRATION_CHUNKS
# ansible-test runs that go at the same time: a target runs its playbooks one
# task after another and waits on timeouts by design, so one run leaves a CPU
# idle. The seconds a target takes on an idle machine (measured, docs/testing.md)
# balance the chunks; a target not listed counts 15.
declare -A target_seconds=(
  [recover_gpu_breaker]=112 [fleet_audit]=110 [vf_health]=78 [sr_iov_cycle_preflight]=57
  [vgpu_canary]=48 [vgpu_sentinel_scan]=32 [gpu_sriov]=28 [vgpu_placement_info]=22
  [vf_health_info]=19 [vgpu_instance_info]=13 [inventory_vgpu_fleet]=13 [run_marker]=10
  [gpu_holders_info]=10 [sr_iov_cycle_resume]=12 [fleet_awx]=2
)
integration_targets() { # what a plain `ansible-test integration` runs: no setup_/prepare_ target, no
  local dir name   # disabled, unsupported, unstable or destructive one
  for dir in "$repo"/tests/integration/targets/*/; do
    name=$(basename "$dir")
    case "$name" in setup_* | prepare_*) continue ;; esac
    grep -qsE '^(disabled|unsupported|unstable|destructive)$' "$dir/aliases" && continue
    echo "$name"
  done
}
# chunk_targets N: N lines, each a chunk's targets (space-separated), heaviest target first into
# the lightest chunk.
chunk_targets() {
  local n=$1 i name best
  local -a load=() chunk=()
  for ((i = 0; i < n; i++)); do load[i]=0; chunk[i]=""; done
  while read -r _ name; do
    best=0
    for ((i = 1; i < n; i++)); do [ "${load[i]}" -lt "${load[best]}" ] && best=$i; done
    load[best]=$(( load[best] + ${target_seconds[$name]:-15} ))
    chunk[best]="${chunk[best]:+${chunk[best]} }$name"
  done < <(integration_targets | while read -r t; do echo "${target_seconds[$t]:-15} $t"; done | sort -rn)
  for ((i = 0; i < n; i++)); do [ -n "${chunk[i]}" ] && echo "${chunk[i]}"; done
}
chunk_seconds() { local t sum=0; for t in $1; do sum=$(( sum + ${target_seconds[$t]:-15} )); done; echo "$sum"; }
integration_job() { # python chunk-number chunks targets...
  local python=$1 i=$2 n=$3; shift 3
  matrix_phase "integration ($i/$n)" integration "$python" "$@"
}

# --- the job pool ---------------------------------------------------------------
# A job is one or more phases in a subshell with its own ansible-test output and
# integration inventory (TEST_LANE, see ansible_test), its output kept in
# build/test-lanes/<job>.log and printed when it ends.
job_run() { # name function args...: records the job's wall and CPU time
  local name=$1; shift
  ( results_file="$results_dir/$name.tsv"; TEST_LANE=$name; SECONDS=0
    "$@"
    took=$SECONDS; times > "$results_dir/$name.times"
    printf '%s\t%s\n' "$took" "$(cpu_seconds < "$results_dir/$name.times")" > "$results_dir/$name.lane" )
}
declare -A job_pids=()  # name -> pid of every job started in the background
job_start() { # name function args...
  local name=$1
  mkdir -p "$repo/build/test-lanes"
  job_run "$@" > "$repo/build/test-lanes/$name.log" 2>&1 &
  job_pids[$name]=$!
  printf '[test] %s: started (%ss after the start)\n' "$name" "$(( $(date +%s) - test_start ))"
}
job_print() { # name: the output of a job that ended
  printf '\n===== job %s (ran in the background; its output follows) =====\n' "$1"
  cat "$repo/build/test-lanes/$1.log"
}
# Every job but molecule's: "seconds name function args..." (seconds on an idle machine,
# to start the longest first).
pool_jobs() {
  local chunks=${INTEGRATION_CHUNKS:-2} i=0 targets python
  for python in 3.11 3.12; do
    [ "$python" = 3.12 ] && ! have_py312 && { echo "1 py312 matrix_phase py3.12-matrix true 3.12"; continue; }
    echo "150 units-py$python matrix_phase units units $python"
    echo "80 sanity-py$python matrix_phase sanity sanity $python"
    i=0
    while read -r targets; do
      i=$((i + 1))
      echo "$(chunk_seconds "$targets") integration-py$python-$i integration_job $python $i $chunks $targets"
    done < <(chunk_targets "$chunks")
  done
  echo "110 checks checks"
}
# ansible-test's SSH key pair (~/.ansible/test/id_rsa{,.pub}), made once before the pool:
# each ansible-test integration makes it when it is missing, and two starting together on
# a fresh machine raced (one saw the other's half-written pair and ssh-keygen asked
# "Overwrite (y/n)?" with no one to answer). Made the way ansible-test makes it
# (core_ci.SshKey: PEM, RSA, no passphrase, "RSA PRIVATE KEY" labels), in a scratch
# directory, then moved in, public half first, never over an existing file.
ansible_test_ssh_key() {
  local dir="$HOME/.ansible/test" scratch
  [ -e "$dir/id_rsa" ] || [ -e "$dir/id_rsa.pub" ] && return 0
  mkdir -p "$dir" && scratch=$(mktemp -d -p "$dir") || return 1
  ssh-keygen -m PEM -q -t rsa -N '' -f "$scratch/id_rsa" < /dev/null \
    && sed -i -E 's/(BEGIN|END) PRIVATE KEY/\1 RSA PRIVATE KEY/' "$scratch/id_rsa" \
    && mv -n "$scratch/id_rsa.pub" "$dir/id_rsa.pub" && mv -n "$scratch/id_rsa" "$dir/id_rsa"
  local rc=$?
  rm -rf "$scratch"
  return "$rc"
}
# run_pool N: run the pool's jobs, the longest first, N at a time; once none is left to
# start, let molecule start more scenarios at once (MOLECULE_JOBS_LATE).
run_pool() {
  local max=$1 name pid spec
  local -a queue=() words=()
  declare -A running=()
  mapfile -t queue < <(pool_jobs | sort -rn -k1,1)
  while [ "${#queue[@]}" -gt 0 ] || [ "${#running[@]}" -gt 0 ]; do
    while [ "${#running[@]}" -lt "$max" ] && [ "${#queue[@]}" -gt 0 ]; do
      spec=${queue[0]}; queue=("${queue[@]:1}")
      read -r -a words <<< "$spec"
      job_start "${words[@]:1}"
      running[${job_pids[${words[1]}]}]=${words[1]}
    done
    [ "${#queue[@]}" -eq 0 ] && [ -n "${MOLECULE_JOBS_FILE:-}" ] && echo "${MOLECULE_JOBS_LATE:-3}" > "$MOLECULE_JOBS_FILE"
    wait -n 2>/dev/null
    for pid in "${!running[@]}"; do
      kill -0 "$pid" 2>/dev/null && continue
      wait "$pid"; name=${running[$pid]}; unset "running[$pid]"
      job_print "$name"
    done
  done
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
  plan) pool_jobs | sort -rn -k1,1; exit 0 ;;  # the jobs `all` runs beside molecule, longest first
  py312) for fn in sanity units integration; do matrix_phase "$fn" "$fn" 3.12; done ;;
  all)
    if [ "${TEST_JOBS:-3}" -le 1 ]; then
      # One phase after another (for a machine with one CPU, or to time phases alone).
      for python in 3.11 3.12; do
        for fn in sanity units integration; do matrix_phase "$fn" "$fn" "$python"; done
      done
      checks; molecule_all
    else
      # The molecule scenarios (mostly waiting on their containers' services and timeouts)
      # run beside a pool of the other jobs, TEST_JOBS at a time.
      export MOLECULE_JOBS_FILE="$results_dir/molecule.jobs"
      MOLECULE_JOBS=${MOLECULE_JOBS:-2} job_start molecule molecule_all
      molecule_pid=${job_pids[molecule]}
      ansible_test_ssh_key || echo "[test] could not make ansible-test's SSH key; each integration job makes it"
      run_pool "${TEST_JOBS:-3}"
      echo "${MOLECULE_JOBS_LATE:-3}" > "$MOLECULE_JOBS_FILE"
      wait "$molecule_pid"
      job_print molecule
      # Each job's JUnit results where people look for them (tests/output/junit).
      mkdir -p "$repo/tests/output/junit"
      for junit in "$repo"/.mnt/*-output/junit; do
        [ -d "$junit" ] && cp -f "$junit"/*.xml "$repo/tests/output/junit/" 2>/dev/null
      done
    fi
    ;;
  *) echo "usage: $0 all|plan|sanity|units|integration|lint|changelog-lint|build-smoke|molecule|eda|browser|py312" >&2; exit 2 ;;
esac

# A job that ended without recording its end (killed, crashed) is a failure.
for name in "${!job_pids[@]}"; do
  [ -e "$results_dir/$name.lane" ] \
    || printf 'FAIL\tjob %s: did not finish\t?\t?\t?\n' "$name" >> "$results_dir/main.tsv"
done
passed=0 failed=0 skipped=0
printf '\n===== results =====\n'
echo "total: $(( $(date +%s) - test_start ))s wall"
read -r busy_end idle_end <<< "$(cpu_ticks)"
if [ -n "${busy_start:-}" ] && [ -n "${busy_end:-}" ] && [ $(( busy_end + idle_end - busy_start - idle_start )) -gt 0 ]; then
  echo "machine CPUs: $(( 100 * (busy_end - busy_start) / (busy_end + idle_end - busy_start - idle_start) ))% busy ($(nproc) CPUs; idle includes I/O wait)"
fi
for lane_file in "$results_dir"/*.lane; do
  [ -e "$lane_file" ] || continue
  IFS=$'\t' read -r took cpu < "$lane_file"
  printf 'job %-20s %5ss wall %5ss CPU\n' "$(basename "$lane_file" .lane)" "$took" "$cpu"
done
for tsv in "$results_dir"/*.tsv; do
  [ -e "$tsv" ] || continue
  while IFS=$'\t' read -r status name took cpu rc; do
    case "$status" in
      PASS) passed=$((passed + 1)); printf 'PASS  %-48s %5ss wall %5ss CPU\n' "$name" "$took" "$cpu" ;;
      FAIL) failed=$((failed + 1)); printf 'FAIL  %-48s %5ss wall %5ss CPU  exit %s\n' "$name" "$took" "$cpu" "$rc" ;;
      SKIP) skipped=$((skipped + 1)); printf 'SKIP  %s: %s\n' "$name" "$took" ;;
    esac
  done < "$tsv"
done
[ -e "$repo/build/molecule-logs/summary.txt" ] && [ -e "$results_dir/molecule.tsv" ] && cat "$repo/build/molecule-logs/summary.txt"
echo "summary: $passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
