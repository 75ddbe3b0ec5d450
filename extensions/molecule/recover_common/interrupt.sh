#!/usr/bin/env bash
# Kill a recovery run right after its SR-IOV disable, as an operator's
# Ctrl-C^2, a lost controller or an OOM kill would.
#   interrupt.sh CONTAINER LOG ansible-playbook ARGS...
# The host's sriov-manage wrapper blocks the enable that follows the disable
# (see ./sriov-manage); this script waits for that, SIGKILLs the whole
# ansible-playbook process group on the controller, then kills the orphaned
# module process left on the host. Exits 0 only when the run was interrupted
# at that point.
set -uo pipefail
container=$1 log=$2
shift 2
podman exec "$container" sh -c 'mkdir -p /run/recover-test && touch /run/recover-test/interrupt-after-disable'
setsid "$@" >"$log" 2>&1 &
pid=$!
for _ in $(seq 600); do
  if podman exec "$container" test -e /run/recover-test/blocked.pids; then
    kill -KILL -- "-$pid"
    wait "$pid" 2>/dev/null
    # The wrapper (now "sleep") and its parent, the gpu_sriov module process.
    podman exec "$container" sh -c 'read -r wrapper module < /run/recover-test/blocked.pids && kill -KILL "$module" "$wrapper"'
    echo "interrupted after the disable (ansible-playbook pid $pid)"
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
echo "timed out waiting for the disable" >&2
exit 1
