#!/usr/bin/env bash
# A real ansible-rulebook run of extensions/eda/rulebooks/vf_quarantine.yml
# (docs/eda.md, docs/testing.md): the source watches one simulated host (the
# fleet fixture of tests/integration/targets/fleet_audit, local connection);
# after its first poll two VFs are quarantined, one on an allowlisted card and
# one on a card that is not. Exactly one playbook run must follow, of
# recover_gpu.yml for the allowlisted card; it passes the circuit breaker and
# ends at sr_iov_cycle's own allowlist refusal (the host allowlists no card),
# so nothing on the host changes. The other quarantine is only printed.
#
#   bash tests/eda/rulebook_run.sh      (EDA_VENV: a venv with ansible-rulebook and
#                                        ansible-core; default .venv-eda; Java 17+ on PATH)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
venv=${EDA_VENV:-$repo/.venv-eda}
if [ ! -x "$venv/bin/ansible-rulebook" ]; then
  echo "no ansible-rulebook in $venv: \`VGPU_TEST_TOOLS=1 bash scripts/bootstrap.sh\` installs it (make test does)" >&2; exit 1
fi
export PATH="$venv/bin:$PATH" ANSIBLE_NOCOLOR=1
export ANSIBLE_COLLECTIONS_PATH="$repo/.collections${ANSIBLE_COLLECTIONS_PATH:+:$ANSIBLE_COLLECTIONS_PATH}"
py="$venv/bin/python"
fixture="$repo/tests/integration/targets/fleet_audit/fleet_fixture.py"
work=$(mktemp -d)
rulebook_pid=""
cleanup() {
  if [ -n "$rulebook_pid" ] && kill -0 "$rulebook_pid" 2>/dev/null; then
    kill -TERM "$rulebook_pid" 2>/dev/null || true
    wait "$rulebook_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
CARD_A=0000:82:00.0 CARD_B=0000:83:00.0

"$py" "$fixture" build --dir "$work" --hosts ok > /dev/null
# The host's store and sysfs tree, and the rulebook's variables.
"$py" - "$work" "$CARD_A" <<'PY'
import json, os, sys
work, card = sys.argv[1], sys.argv[2]
host = json.load(open(os.path.join(work, "inventory.json")))["all"]["hosts"]["ok-000"]
store = os.path.join(host["hypeman_vgpu_data_dir"], "gpu", "vf-health.json")
open(os.path.join(work, "store_path"), "w").write(store)
variables = {
    "vf_quarantine_hosts": [{"name": "ok-000", "store_path": store, "sysfs_root": host["hypeman_vgpu_sysfs_root"]}],
    "vf_quarantine_recover_allowlist": ["ok-000/" + card],
    "vf_quarantine_state_path": os.path.join(work, "state", "cursor.json"),
    "vf_quarantine_interval": 0.5, "vf_quarantine_debounce": 0,
    # recover_gpu.yml's breaker counts the hosts of target_hosts: here one host, whose card A is
    # most of its slots; let the breaker pass so the run reaches sr_iov_cycle with the card.
    "max_capacity_loss_pct": 100,
}
json.dump(variables, open(os.path.join(work, "vars.json"), "w"))
PY
store=$(cat "$work/store_path")

# wait_for SECONDS COMMAND...: poll until COMMAND succeeds; fail (with the log) after SECONDS.
wait_for() {
  local seconds=$1 start=$SECONDS; shift
  until "$@"; do
    if [ $((SECONDS - start)) -ge "$seconds" ] || ! kill -0 "$rulebook_pid" 2>/dev/null; then
      cat "$work/rulebook.log"; echo "FAIL: waited ${seconds}s for: $*"; exit 1
    fi
    sleep 0.5
  done
}
log_has() { grep -qF -- "$1" "$work/rulebook.log"; }

# Every ansible-playbook run appends to this log (ansible-rulebook also repeats a failed run's
# output in its own log, so the runs are counted here).
export ANSIBLE_LOG_PATH="$work/ansible.log"
(cd "$work" && exec ansible-rulebook -i "$work/inventory.json" --rulebook hypeman.vgpu.vf_quarantine \
   --vars "$work/vars.json" > "$work/rulebook.log" 2>&1) &
rulebook_pid=$!
# The cursor appears after the source's first poll: what the store held then is the baseline.
wait_for 180 test -e "$work/state/cursor.json"
"$py" - "$store" <<'PY'
import json, os, sys
store = sys.argv[1]
# The fixture's first VF of each card (hosttree: VFs from function 4 of the card's slot).
os.makedirs(os.path.dirname(store), exist_ok=True)
records = [{"vf_address": "0000:82:00.4", "quarantined_at": "2026-09-01T10:00:00Z"},
           {"vf_address": "0000:83:00.4", "quarantined_at": "2026-09-01T10:00:00Z"}]
with open(store + ".tmp", "w") as handle:
    json.dump({"version": 1, "records": records}, handle, indent=2)
os.rename(store + ".tmp", store)
PY
wait_for 300 log_has "PLAY RECAP"
# A few more polls: the fired events must not come back.
sleep 5
kill -TERM "$rulebook_pid"; wait "$rulebook_pid" 2>/dev/null || true; rulebook_pid=""
cat "$work/rulebook.log"

fail() { echo "FAIL: $*"; exit 1; }
runs=$(grep -cF "PLAY [Recover GPU | Check the run's inputs]" "$work/ansible.log" || true)
[ "$runs" = 1 ] || fail "expected exactly one recover_gpu.yml run, saw $runs"
log_has "$CARD_A is not on this host's allowlist of cards automation may cycle" \
  || fail "the run did not reach sr_iov_cycle's allowlist check for $CARD_A"
log_has "Cards out at once during this run: 1 (limit 1)" || fail "the circuit breaker did not pass as expected"
log_has "ok-000/$CARD_B" || fail "the quarantine on the card that is not allowlisted was not printed"
if grep -F "target_gpu" "$work/rulebook.log" | grep -qF "$CARD_B"; then fail "a run was started for $CARD_B"; fi
echo "rulebook run: 1 passed, 0 failed"
