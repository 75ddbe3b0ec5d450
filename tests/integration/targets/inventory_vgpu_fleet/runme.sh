#!/usr/bin/env bash
# The vgpu_fleet inventory plugin on a report the real audit wrote: the fleet_audit
# target's simulated hosts (one problem class each, one unreachable host) are
# audited, then ansible-inventory --graph and --list must show each host in the
# groups the report classified it into, with its cards and issue codes; an AWX
# job artifact of the same audit gives the groups an artifact can name; a stale
# or garbage report fails the inventory with a clear error.
set -eux
here=$(cd "$(dirname "$0")" && pwd)
py=$(command -v python)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" "$here/../fleet_audit/fleet_fixture.py" build --dir "$work" --hosts ok,legacy,drained,overflow,draining \
  --unreachable 1 > /dev/null
ansible-playbook -i "$work/inventory.json" hypeman.vgpu.audit -e audit_report_dir="$work/audit"

inv() { # config-file ansible-inventory-args...
  local config=$1; shift
  ANSIBLE_INVENTORY_ENABLED=hypeman.vgpu.vgpu_fleet ANSIBLE_INVENTORY_UNPARSED_FAILED=true \
    ansible-inventory -i "$config" "$@"
}
cat > "$work/fleet.vgpu_fleet.yml" <<YAML
plugin: hypeman.vgpu.vgpu_fleet
report: $work/audit
max_age: 3600
compose:
  target_gpu: vgpu_ready_cards | first | default(omit)
keyed_groups:
  - key: vgpu_status
    prefix: status
YAML
inv "$work/fleet.vgpu_fleet.yml" --graph | tee "$work/graph.txt"
inv "$work/fleet.vgpu_fleet.yml" --list > "$work/list.json"
"$py" "$here/check_inventory.py" report --report "$work/audit/fleet-audit.json" --expected "$work/expected.json" \
  --graph "$work/graph.txt" \
  --list "$work/list.json"

# The example source docs/awx.md tells AWX users to copy, on the same report.
root=$("$py" "$here/../fleet_audit/fleet_fixture.py" root)
sed "s|^report: .*|report: $work/audit|" "$root/docs/awx/hypeman.vgpu_fleet.yml" > "$work/example.vgpu_fleet.yml"
inv "$work/example.vgpu_fleet.yml" --list > "$work/example-list.json"
"$py" "$here/check_inventory.py" example --expected "$work/expected.json" --list "$work/example-list.json"

# The same audit as AWX keeps it: the job (GET /api/v2/jobs/N/) with the set_stats artifact.
"$py" "$here/check_inventory.py" awx-job --report "$work/audit/fleet-audit.json" --out "$work/job-7.json"
sed "s|report: .*|report: $work/job-7.json|" "$work/fleet.vgpu_fleet.yml" > "$work/awx.vgpu_fleet.yml"
inv "$work/awx.vgpu_fleet.yml" --list > "$work/awx-list.json"
"$py" "$here/check_inventory.py" artifact --expected "$work/expected.json" --list "$work/awx-list.json"

# A stale report and a garbage one fail the inventory, naming the file and what is expected.
sed "s|max_age: 3600|max_age: 1|" "$work/fleet.vgpu_fleet.yml" > "$work/stale.vgpu_fleet.yml"
sleep 2
if inv "$work/stale.vgpu_fleet.yml" --list > "$work/stale.out" 2>&1; then
  echo "FAIL: a report older than max_age was accepted"; exit 1
fi
grep -q "expected at most max_age=1 seconds" "$work/stale.out"
printf '{"schema": 1, "kind": "audit", "hosts": [{"host": "x"}]}' > "$work/garbage.json"
sed "s|report: .*|report: $work/garbage.json|" "$work/fleet.vgpu_fleet.yml" > "$work/garbage.vgpu_fleet.yml"
if inv "$work/garbage.vgpu_fleet.yml" --list > "$work/garbage.out" 2>&1; then
  echo "FAIL: a report of the wrong shape was accepted"; exit 1
fi
grep -q "garbage.json is not usable: hosts\[0\].status is null; expected a string" "$work/garbage.out"
if grep -q "Traceback" "$work/stale.out" "$work/garbage.out"; then echo "FAIL: a traceback"; exit 1; fi
echo "inventory_vgpu_fleet: all checks passed"
