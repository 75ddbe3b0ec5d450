#!/usr/bin/env bash
# Run molecule scenarios on the simulated vGPU host.
#   scripts/molecule.sh [scenario ...]    (default: every extensions/molecule/*/molecule.yml)
# Builds (or reuses) the cached image, then per scenario runs
# create, prepare, converge, idempotence, verify, destroy as separate
# molecule steps so each is timed; whatever happens, the scenario's containers
# are destroyed. No syntax step: ansible-lint (make test) syntax-checks every
# scenario playbook with the same ansible-core (docs/testing.md). Prints a
# table of phase times and a summary line.
#
# MOLECULE_JOBS=N runs N scenarios at a time (default 1). Scenarios are
# independent: each has its own containers (distinct names, no network) and
# its own ephemeral directory. With more than one job each scenario's output
# goes to build/molecule-logs/<scenario>.log and is printed when it ends.
# MOLECULE_JOBS_FILE, if set, names a file holding a new N, read before each
# scenario starts (scripts/test.sh raises it once its other lanes end).
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
  # Every scenario, the longest first (seconds on an idle machine, one at a time; a scenario
  # not listed counts 200), so that running several at once ends with short ones.
  declare -A scenario_seconds=([recover_faults]=390 [recover_happy]=250 [recover_resume]=240
    [fleet_audit]=215 [vgpu_host]=200 [recover_store_edit]=90 [sim_smoke]=80)
  mapfile -t scenarios < <(cd extensions/molecule && for f in */molecule.yml; do
    name=$(dirname "$f"); echo "${scenario_seconds[$name]:-200} $name"; done | sort -rn | cut -d' ' -f2)
fi
jobs=${MOLECULE_JOBS:-1}
logdir=build/molecule-logs
rm -rf "$logdir" && mkdir -p "$logdir"

containers_of() { # scenario -> platform (container) names
  "$VIRTUAL_ENV/bin/python" -c 'import sys, yaml
for p in yaml.safe_load(open(sys.argv[1])).get("platforms", []): print(p["name"])' \
    "extensions/molecule/$1/molecule.yml"
}

# Each scenario's molecule state (which steps ran) lives in build/molecule-state/<scenario>
# (molecule's default, ~/.ansible/tmp/molecule.<hash of the checkout's name>.<scenario>,
# is shared by checkouts with the same name), so a fresh run can see there is none.
state_of() { echo "$PWD/build/molecule-state/$1"; }
scenario_molecule() { # scenario molecule-args...: molecule with that scenario's state directory
  local scenario=$1; shift
  MOLECULE_EPHEMERAL_DIRECTORY=$(state_of "$scenario") molecule "$@"
}

destroy_scenario() { # scenario: molecule destroy, then remove any container it left
  scenario_molecule "$1" destroy -s "$1" >/dev/null 2>&1
  local name
  for name in $(containers_of "$1"); do
    podman container exists "$name" 2>/dev/null && podman rm -f "$name" >/dev/null 2>&1
  done
}

container_cpu() { # scenario -> CPU seconds its containers used so far (cgroup v1 or v2), or "?"
  local name path total=0 usage
  for name in $(containers_of "$1"); do
    path=$(podman inspect --format '{{.State.CgroupPath}}' "$name" 2>/dev/null)
    # A stopped container has no cgroup: never read the root's (the whole machine).
    case "$path" in /?*) ;; *) echo "?"; return ;; esac
    if [ -r "/sys/fs/cgroup/cpuacct$path/cpuacct.usage" ]; then
      usage=$(( $(cat "/sys/fs/cgroup/cpuacct$path/cpuacct.usage") / 1000000 ))  # ns -> ms
    elif [ -r "/sys/fs/cgroup$path/cpu.stat" ]; then
      usage=$(( $(awk '$1 == "usage_usec" {print $2}' "/sys/fs/cgroup$path/cpu.stat") / 1000 ))
    else echo "?"; return; fi
    total=$((total + usage))
  done
  echo $(( (total + 500) / 1000 ))
}

run_scenario() { # scenario: the timed phases; writes $logdir/<scenario>.row, returns 0 on PASS
  local scenario=$1 status=PASS phase start rc cpu times=() container_cpu_s="?"
  # Leftovers of an interrupted run: its containers and molecule's record of its steps.
  # Without either (a fresh machine, a run that ended) there is nothing to destroy,
  # and molecule's destroy playbook costs seconds of CPU per scenario.
  local name leftover=
  [ -e "$(state_of "$scenario")" ] && leftover=1
  for name in $(containers_of "$scenario"); do podman container exists "$name" 2>/dev/null && leftover=1; done
  if [ -n "$leftover" ]; then destroy_scenario "$scenario"; fi
  rm -rf "$(state_of "$scenario")"
  for phase in create prepare converge idempotence verify destroy; do
    # What ran inside the containers (boot, services, modules) before they go.
    [ "$phase" = destroy ] && times+=("containers ${container_cpu_s}c")
    start=$(date +%s)
    printf '\n===== molecule %s: %s =====\n' "$scenario" "$phase"
    # CPU: user+sys of molecule, ansible and podman's client on the controller
    # (what runs inside the containers is podman's, not counted here).
    ( scenario_molecule "$scenario" "$phase" -s "$scenario"; rc=$?; times > "$logdir/$scenario.times"; exit "$rc" ); rc=$?
    cpu=$(sed -n 2p "$logdir/$scenario.times" | awk '{ t = 0; for (i = 1; i <= 2; i++) { split($i, p, /[ms]/); t += p[1] * 60 + p[2] } printf "%d", t + 0.5 }')
    if [ "$rc" = 0 ]; then
      times+=("$phase $(( $(date +%s) - start ))s/${cpu}c")
      [ "$phase" = verify ] && container_cpu_s=$(container_cpu "$scenario")
    else
      times+=("$phase FAILED after $(( $(date +%s) - start ))s/${cpu}c")
      status=FAIL
      break
    fi
  done
  # A failed scenario's state directory stays for a look (the next run destroys first).
  if [ "$status" = PASS ]; then rm -rf "$(state_of "$scenario")"; else destroy_scenario "$scenario"; fi
  echo "$status  $scenario: ${times[*]}" > "$logdir/$scenario.row"
  [ "$status" = PASS ]
}

cleanup() { # on interrupt: stop running scenarios, destroy what they left
  local pids scenario
  mapfile -t pids < <(jobs -p)
  [ "${#pids[@]}" -gt 0 ] && kill "${pids[@]}" 2>/dev/null && wait 2>/dev/null
  for scenario in "${scenarios[@]}"; do
    [ -f "$logdir/$scenario.row" ] || destroy_scenario "$scenario"
  done
}
trap 'cleanup; exit 130' INT TERM

total_start=$(date +%s)
if [ "$jobs" -le 1 ]; then
  for scenario in "${scenarios[@]}"; do run_scenario "$scenario"; done
else
  declare -A running=()  # pid -> scenario
  jobs_seen=$jobs
  next=0
  while [ "$next" -lt "${#scenarios[@]}" ] || [ "${#running[@]}" -gt 0 ]; do
    if [ -n "${MOLECULE_JOBS_FILE:-}" ] && [ -s "$MOLECULE_JOBS_FILE" ]; then
      more=$(cat "$MOLECULE_JOBS_FILE")
      [[ "$more" =~ ^[1-9][0-9]*$ ]] && [ "$more" != "$jobs" ] && { jobs=$more; jobs_seen+=" -> $jobs"; }
    fi
    while [ "${#running[@]}" -lt "$jobs" ] && [ "$next" -lt "${#scenarios[@]}" ]; do
      scenario=${scenarios[$next]}; next=$((next + 1))
      run_scenario "$scenario" > "$logdir/$scenario.log" 2>&1 &
      running[$!]=$scenario
    done
    # With a jobs file, look again every few seconds (a raised N starts a
    # scenario at once); without, sleep until a scenario ends.
    if [ -n "${MOLECULE_JOBS_FILE:-}" ]; then sleep 3; else wait -n 2>/dev/null; fi
    for pid in "${!running[@]}"; do
      kill -0 "$pid" 2>/dev/null && continue
      scenario=${running[$pid]}; unset "running[$pid]"
      cat "$logdir/$scenario.log"
    done
  done
fi

rows=() passed=0 failed=0
for scenario in "${scenarios[@]}"; do
  if [ -f "$logdir/$scenario.row" ]; then rows+=("$(cat "$logdir/$scenario.row")")
  else rows+=("FAIL  $scenario: did not finish"); fi
  case "${rows[-1]}" in PASS*) passed=$((passed + 1)) ;; *) failed=$((failed + 1)) ;; esac
done

# Also kept in $logdir/summary.txt for scripts/test.sh's summary.
{
  printf '\n===== molecule results (per step: wall s / controller CPU c; containers: CPU inside them) =====\n'
  echo "image: ${image_time}s ($VGPU_SIM_IMAGE)"
  printf '%s\n' "${rows[@]}"
  echo "molecule total: $(( $(date +%s) - total_start ))s (${jobs_seen:-$jobs} at a time)"
  echo "molecule: $passed passed, $failed failed"
} | tee "$logdir/summary.txt"
[ "$failed" = 0 ]
