#!/usr/bin/env bash
# Interrupt a recovery run with Ctrl-C while its sriov-manage -e runs on the host.
#   interrupt.sh CONTAINER LOG ansible-playbook ARGS...
# The host's sriov-manage wrapper blocks the enable that follows the disable
# until /run/recover-test/release exists (see ./sriov-manage). This script
# waits for that, sends SIGINT to the ansible-playbook process group on the
# controller (what Ctrl-C in a terminal does) and waits for it to exit. The
# job on the host must survive, still blocked: the next run has to wait for
# it. Exits 0 only when the run was interrupted at that point and the job runs.
set -uo pipefail
container=$1 log=$2
shift 2
# A command in the container: through its command runner, or podman exec where none listens
# (tests/sim/exec_agent.py); the poll below runs one every half second.
agent="$(cd "$(dirname "$0")/../../.." && pwd)/tests/sim/exec_agent.py"
in_container() { python3 "$agent" run "$container" "$@"; }
in_container sh -c \
  'mkdir -p /run/recover-test && rm -f /run/recover-test/release && touch /run/recover-test/interrupt-after-disable'
setsid "$@" >"$log" 2>&1 &
pid=$!
for _ in $(seq 600); do
  if in_container test -e /run/recover-test/blocked.pids; then
    sleep 2  # let the run poll the job once: the Ctrl-C lands in the wait
    kill -INT -- "-$pid"
    for _ in $(seq 120); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then
      echo "ansible-playbook did not stop on Ctrl-C:" >&2
      tail -20 "$log" >&2
      kill -KILL -- "-$pid"
      exit 1
    fi
    wait "$pid"
    rc=$?
    # The wrapper (blocked) and its parent, the gpu_sriov module process, must still run.
    # shellcheck disable=SC2016  # the container's shell expands them
    if ! in_container sh -c 'read -r wrapper module < /run/recover-test/blocked.pids && kill -0 "$module" "$wrapper"'; then
      echo "the sriov-manage job on the host did not survive the Ctrl-C" >&2
      exit 1
    fi
    echo "interrupted with Ctrl-C while sriov-manage -e ran on the host (ansible-playbook exited $rc)"
    exit 0
  fi
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "the run ended before it reached the enable:" >&2
    tail -40 "$log" >&2
    exit 1
  fi
  sleep 0.5
done
kill -KILL -- "-$pid"
echo "timed out waiting for the enable" >&2
exit 1
