#!/usr/bin/env bash
# The vgpu_canary role and module against the simulator's hypeman API (tests/sim, marker era,
# real VMM stand-ins): one L40S card 0000:82:00.0 with 4 VFs.
#   1. check mode: nothing created, nothing deleted;
#   2. a healthy card: the canary passes and is deleted;
#   3. an interrupted run (ansible-playbook and the module killed with SIGKILL mid-wait) leaves
#      its canary; the next run deletes it first, then passes;
#   4. a wedged card, the card kept in service (vgpu_canary_quarantine_on: []): the canary fails,
#      the run fails, the canary is deleted, the store is untouched;
#   5. a wedged card: the same, and every VF of the card is quarantined again through store_edit
#      (owned, the evidence in the ledger reason), hypeman's API agrees after its restart.
# hypeman's unit is a stand-in `systemctl` first on PATH (no systemd here): `show`, `stop` and
# `start` of "hypeman" stop and start the API stand-in on the same port, as the real unit would.
# The modules read the tree's proc root: this machine's /proc shows other tests' hypeman stand-ins,
# which store_edit would rightly refuse to edit under.
set -eux
py=$(command -v python)
coll=$("$py" -c 'import os
for base in os.environ.get("ANSIBLE_COLLECTIONS_PATH", "").split(":"):
    path = os.path.join(base, "ansible_collections", "hypeman", "vgpu")
    if base and os.path.isdir(os.path.join(path, "tests", "sim")):
        print(path)
        break')
work=$(mktemp -d)
root="$work/host"
sim() { PYTHONPATH="$coll" "$py" -m tests.sim --root "$root" "$@"; }
cleanup() {
  if [ -f "$work/api.pid" ]; then kill "$(cat "$work/api.pid")" 2>/dev/null || true; fi
  sim teardown > /dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

sim build --layout '{"cards": [{"model": "L40S", "address": "0000:82:00.0", "numvfs": 4}], "config": {"threshold": 2}}' > /dev/null
port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p "$work/bin"
cat > "$work/bin/systemctl" <<UNIT
#!/usr/bin/env bash
# hypeman's unit, for this test only: the API stand-in in the background, its pid in $work/api.pid.
set -u
unit=\${@: -1}; unit=\${unit//\'/}; unit=\${unit%.service}
[ "\$unit" = hypeman ] || { echo "Unit \$unit.service could not be found." >&2; exit 4; }
running() { [ -f "$work/api.pid" ] && kill -0 "\$(cat "$work/api.pid")" 2>/dev/null; }
state() { if running; then echo active; else echo inactive; fi; }
case "\$1" in
  show)
    if [ "\${2:-}" = --property=ActiveState ]; then state; else printf 'Id=hypeman.service\nLoadState=loaded\nActiveState=%s\n' "\$(state)"; fi ;;
  is-active) state; running ;;
  stop)
    if running; then pid=\$(cat "$work/api.pid"); kill "\$pid"; while kill -0 "\$pid" 2>/dev/null; do sleep 0.1; done; fi ;;
  start)
    if ! running; then
      rm -f "$root/.vgpu-sim/api.json"
      PYTHONPATH="$coll" setsid "$py" -m tests.sim --root "$root" api --listen 127.0.0.1 --port $port >> "$work/api.log" 2>&1 < /dev/null &
      echo \$! > "$work/api.pid"
      for _ in \$(seq 100); do [ -f "$root/.vgpu-sim/api.json" ] && break; sleep 0.1; done
    fi ;;
  *) exit 0 ;;
esac
UNIT
chmod +x "$work/bin/systemctl"
export PATH="$work/bin:$PATH"
systemctl start hypeman
[ "$(systemctl show --property=ActiveState --value hypeman)" = active ]
cat > "$work/vars.yml" <<VARS
hypeman_vgpu_data_dir: $root/var/lib/hypeman
hypeman_vgpu_sysfs_root: $root/sys
hypeman_vgpu_proc_root: $root/proc
hypeman_vgpu_dev_root: $root/dev
hypeman_vgpu_state_dir: $root/var/lib/hypeman-vgpu
hypeman_vgpu_config_path: $root/etc/hypeman/config.yaml
hypeman_vgpu_api_url: http://127.0.0.1:$port
hypeman_vgpu_api_token: $(sim token)
ansible_python_interpreter: $py
VARS
guests="$root/var/lib/hypeman/guests"
no_guests() { [ -z "$(ls -A "$guests" 2>/dev/null)" ] || { echo "FAIL: instances left: $(ls "$guests")"; exit 1; }; }
run() {  # run NAME EXPECTED_RC ARGS...
  local name=$1 expected=$2 rc=0; shift 2
  ansible-playbook -i localhost, canary.yml -e @"$work/vars.yml" "$@" > "$work/$name.log" 2>&1 || rc=$?
  cat "$work/$name.log"
  [ "$rc" = "$expected" ] || { echo "FAIL: $name exited $rc, expected $expected"; exit 1; }
}
has() { grep -qF -- "$2" "$work/$1.log" || { echo "FAIL: $1: no '$2'"; exit 1; }; }
store_sum() { sha256sum "$root/var/lib/hypeman/gpu/vf-health.json" 2>/dev/null || echo none; }

# 1. Check mode predicts and changes nothing.
before=$(store_sum)
run check 0 --check
has check "Check mode: a canary of NVIDIA L40S-1Q would boot on 0000:82:00.0"
no_guests
[ "$(store_sum)" = "$before" ]

# 2. Healthy card: passes, canary deleted.
run healthy 0
has healthy "passed on VF 0000:82:00."
has healthy "HYPEMAN-GPU-INIT-OK ts="
has healthy "It was deleted."
no_guests

# 3. Interrupted: the markers-only wait never ends on... a vsock-only console? Here the console has markers,
#    so wait on the vsock channel instead (nothing there) and kill everything with SIGKILL mid-wait.
setsid ansible-playbook -i localhost, canary.yml -e @"$work/vars.yml" -e canary_mode=vsock -e canary_timeout=600 \
  > "$work/interrupted.log" 2>&1 &
victim=$!
for _ in $(seq 300); do [ -n "$(ls -A "$guests" 2>/dev/null)" ] && break; sleep 0.2; done
sleep 2
left=$(ls "$guests")
[ -n "$left" ] || { cat "$work/interrupted.log"; echo "FAIL: no canary was booted"; exit 1; }
kill -9 -- "-$victim"
wait "$victim" || true
[ "$(ls "$guests")" = "$left" ] || { echo "FAIL: the killed run's canary should still be there"; exit 1; }
run next 0
has next "CANARY-LEFTOVERS [$left]"
has next "passed on VF 0000:82:00."
no_guests

# 4. Wedged card: the canary fails, the run fails, the canary is deleted; the card stays in service here.
sim wedge 0000:82:00.4 0000:82:00.5 0000:82:00.6 0000:82:00.7 > /dev/null
before=$(store_sum)
run wedged 2 -e '{"canary_quarantine_on": []}'
has wedged "failed: "
has wedged "HYPEMAN-GPU-INIT-FAILED ts="
has wedged "The canary was deleted."
has wedged "The card was left in service: verdict \"failed\" is not in vgpu_canary_quarantine_on."
no_guests
[ "$(store_sum)" = "$before" ]

# 5. Wedged card, default quarantine_on [failed]: every VF quarantined again, owned, the evidence as the reason.
run requarantine 2
has requarantine "Every VF of 0000:82:00.0 is quarantined again (owned by this collection"
has requarantine "The canary was deleted."
no_guests
"$py" - "$root" <<'CHECK'
import json, sys
root = sys.argv[1]
store = json.load(open(root + "/var/lib/hypeman/gpu/vf-health.json"))
quarantined = sorted(r["vf_address"] for r in store["records"] if r.get("quarantined_at"))
assert quarantined == ["0000:82:00.%d" % f for f in (4, 5, 6, 7)], quarantined
ledger = [json.loads(line) for line in open(root + "/var/lib/hypeman-vgpu/ledger.jsonl")]
ours = [e for e in ledger if e.get("action") == "quarantine"]
assert len(ours) == 4 and all("canary" in e["reason"] and "HYPEMAN-GPU-INIT-FAILED" in e["reason"] for e in ours), ours
CHECK
[ "$(systemctl show --property=ActiveState --value hypeman)" = active ]
curl -sf -H "Authorization: Bearer $(sim token)" "http://127.0.0.1:$port/resources" | grep -q '"quarantined_slots": 4'

# 6. sr_iov_cycle with the canary on and no image: refused after its preflight, before the drain.
before=$(store_sum)
rc=0
ansible-playbook -i localhost, cycle.yml -e @"$work/vars.yml" -e '{"hypeman_vgpu_allowed_gpus": ["0000:82:00.0"]}' \
  -e sr_iov_cycle_sriov_manage="$root/usr/lib/nvidia/sriov-manage" > "$work/cycle.log" 2>&1 || rc=$?
cat "$work/cycle.log"
[ "$rc" = 2 ] || { echo "FAIL: cycle exited $rc, expected 2"; exit 1; }
has cycle "sr_iov_cycle_canary is on but sr_iov_cycle_canary_image (\"\")"
has cycle "Refusing: nothing was drained or stopped."
[ "$(store_sum)" = "$before" ]
[ ! -e "$root/var/lib/hypeman-vgpu/recovery/0000:82:00.0.json" ]

# 7. Cleanup alone, nothing left: no change.
run cleanup 0 -e canary_action=cleanup
has cleanup "ok: [localhost]"
