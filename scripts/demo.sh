#!/usr/bin/env bash
# `make demo`: on a fresh Debian machine as root, install what is needed,
# build the simulated-host image if absent, boot a simulated hypeman vGPU host
# in a container, run the collection against it and print the report an
# operator would read. Removes its container on exit; re-runnable.
set -euo pipefail
cd "$(dirname "$0")/.." || exit 1
name=${VGPU_DEMO_CONTAINER:-hypeman-vgpu-demo}

[ "$(id -u)" = 0 ] || { echo "make demo must run as root (podman, debootstrap)" >&2; exit 1; }
log() { printf '[demo] %s\n' "$*" >&2; }

bash scripts/bootstrap.sh >&2
bash scripts/bootstrap_molecule.sh >&2
# shellcheck source=scripts/molecule_env.sh
. scripts/molecule_env.sh
image=$(bash scripts/sim_image.sh)
VENV_PY="$PWD/.venv/bin/python"

work=$(mktemp -d)
cleanup() {
  podman rm -f "$name" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
cleanup_stale() { podman container exists "$name" && podman rm -f "$name" >/dev/null; return 0; }
cleanup_stale
mkdir -p "$work"

log "booting the simulated host ($image) as container $name"
# CAP_SYS_PTRACE: root reads every /proc/<pid>/fd, as on a real host;
# CAP_SYS_ADMIN: vgpu-sim expose-driver bind-mounts the simulated /proc/driver/nvidia.
podman run -d --name "$name" --hostname "$name" --systemd=always --network none \
  --cap-add SYS_PTRACE --cap-add SYS_ADMIN "$image" /sbin/init >/dev/null

inventory="$name,"
playbook() {
  ansible-playbook -i "$inventory" -c containers.podman.podman \
    -e ansible_python_interpreter=/usr/bin/python3 "$@"
}
quiet_playbook() { # log-name playbook-args...: output to $work/<log-name>.log, shown only on failure
  local log_file="$work/$1.log"; shift
  playbook "$@" >"$log_file" 2>&1 || { cat "$log_file" >&2; exit 1; }
}
log "preparing: two L40S cards, four instances, one wedged VF, DCGM and hypeman API stand-ins"
quiet_playbook prepare extensions/molecule/resources/prepare_sim_host.yml
log "running the collection's info modules"
quiet_playbook report extensions/molecule/resources/demo_report.yml -e "demo_report_file=$work/report.txt"
echo
cat "$work/report.txt"

# The fleet audit (playbooks/audit.yml) over the simulated host, as AWX would
# schedule it; the report stays in build/demo-audit for the operator to open.
report_dir="$PWD/build/demo-audit"
rm -rf "$report_dir" && mkdir -p "$report_dir"
token=$(podman exec "$name" vgpu-sim token)
cat > "$work/sim_vars.yml" <<VARS
hypeman_vgpu_data_dir: /srv/vgpu-sim/var/lib/hypeman
hypeman_vgpu_sysfs_root: /srv/vgpu-sim/sys
hypeman_vgpu_proc_root: /proc
hypeman_vgpu_dev_root: /srv/vgpu-sim/dev
hypeman_vgpu_state_dir: /srv/vgpu-sim/var/lib/hypeman-vgpu
hypeman_vgpu_config_path: /srv/vgpu-sim/etc/hypeman/config.yaml
hypeman_vgpu_api_url: http://127.0.0.1:8080
hypeman_vgpu_api_token: "$token"
hypeman_vgpu_become: false
audit_report_dir: $report_dir
VARS
log "running the fleet audit (playbooks/audit.yml, read-only)"
quiet_playbook audit playbooks/audit.yml -e "@$work/sim_vars.yml"
echo
echo "== fleet audit report: $report_dir (fleet-audit.json, .md, .html)"
# One line: where the HTML report is and what its health map shows (plugin_utils/fleet_pictures.py).
PYTHONPATH="$PWD/.collections" "$VENV_PY" -c 'import json, sys
from ansible_collections.hypeman.vgpu.plugins.plugin_utils import fleet_pictures
print("== open %s: %s" % (sys.argv[2], fleet_pictures.map_line(json.load(open(sys.argv[1])))))' \
  "$report_dir/fleet-audit.json" "$report_dir/fleet-audit.html"
"$VENV_PY" -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))["summary"], indent=2, sort_keys=True))' \
  "$report_dir/fleet-audit.json"
# Which hypeman sentinel watches the host (docs/hypeman-versions.md): console markers or the vsock poll.
"$VENV_PY" -c 'import json, sys
for host in json.load(open(sys.argv[1]))["hosts"]:
    sentinel = host.get("sentinel") or {}
    print("== sentinel mode of %s: %s (%s); guest-log evidence: %s" % (
        host["host"], sentinel.get("sentinel_mode", "not audited"), sentinel.get("sentinel_mode_reason", "-"),
        sentinel.get("log_evidence", "-")))' "$report_dir/fleet-audit.json"
# Recovery (playbooks/recover_gpu.yml): hypeman's sentinel reports the wedged
# instance's second init failure, which quarantines VF 0000:e3:00.5; the card is
# drained while its tenants stop their instances, DCGM quiesced, SR-IOV cycled,
# the quarantine cleared with hypeman stopped, and everything verified.
log "wedging VF 0000:e3:00.5: hypeman records a second driver-init failure and quarantines it"
quiet_playbook wedge extensions/molecule/recover_common/prepare.yml
log "recovering card 0000:e3:00.0 (playbooks/recover_gpu.yml; a few minutes)"
quiet_playbook recovery extensions/molecule/recover_common/demo_recovery.yml \
  -e "demo_recovery_file=$work/recovery.txt"
cp "$work/recovery.log" build/demo-recovery.log
echo
cat "$work/recovery.txt"
echo "(full recovery run: build/demo-recovery.log)"

log "done; removing $name"
