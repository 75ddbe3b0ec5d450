#!/usr/bin/env bash
# Fleet audit and reconcile over a simulated fleet (local connection, one tree
# per host, each host a different problem class, one unreachable host):
#   audit -> report lists every class correctly, hosts needing action first;
#   audit --check -> identical report, every file under the trees unchanged;
#   audit_fail_on -> the job fails after the report; a bad policy fails first;
#   ansible-runner (AWX's engine) -> the set_stats artifact arrives;
#   Prometheus textfiles; reconcile --check (nothing changes), reconcile
#   (safe repairs, listed), reconcile again (nothing to do), audit after.
set -euxo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py=$(command -v python)
work=$(mktemp -d)
serve_pid=
cleanup() { if [ -n "$serve_pid" ]; then kill "$serve_pid" || true; wait "$serve_pid" || true; fi; rm -rf "$work"; }
trap cleanup EXIT
hosts=ok,legacy,invalid,drained,draining,overflow,sentinel,pending,stale,below,metadata,config,wrongpaths,wedge
fixture() { "$py" "$here/fleet_fixture.py" "$@"; }
check() { "$py" "$here/fleet_checks.py" "$@"; }
playbook() { ansible-playbook -i "$work/inventory.json" "$@"; }

fixture build --dir "$work" --hosts "$hosts" --unreachable 1 > /dev/null
fixture checksum --dir "$work" > "$work/tree-0.json"

# Audit: read-only, unreachable host reported but not fatal.
playbook hypeman.vgpu.audit -e audit_report_dir="$work/audit"
fixture checksum --dir "$work" > "$work/tree-1.json"
check same-tree "$work/tree-0.json" "$work/tree-1.json"
check report --report "$work/audit/fleet-audit.json" --expected "$work/expected.json"
check policy --report "$work/audit/fleet-audit.json"

# The same audit in check mode: identical results, nothing touched, nothing reported as changed
# (creating the report directory is the job's output, not a change). The extras' settings and
# the sentinel mode are given as null here, which means unset (the extras' used to fail on
# `length` of None, a null mode failed the role's validation as "got: ").
playbook hypeman.vgpu.audit --check -e audit_report_dir="$work/audit-check" \
  -e '{"audit_prometheus_dir": null, "hypeman_vgpu_metrics_url": null, "hypeman_vgpu_sentinel_mode": null}' \
  | tee "$work/audit-check.log"
grep -E 'changed=[1-9]' "$work/audit-check.log" && { echo "FAIL: the check-mode audit reports a change"; exit 1; }
# No host needs an extra here: the per-host play ends once for all hosts, no host reaches the extras.
grep -q 'End the play when no host needs the extras' "$work/audit-check.log"
grep -q 'Keep the metrics sample and the result for a separate report job' "$work/audit-check.log" \
  && { echo "FAIL: hosts went on to the extras though none needs them"; exit 1; }
fixture checksum --dir "$work" > "$work/tree-2.json"
check same-tree "$work/tree-0.json" "$work/tree-2.json"
check same-report "$work/audit/fleet-audit.json" "$work/audit-check/fleet-audit.json"

# Policies decide whether the job fails; the report is written first.
if playbook hypeman.vgpu.audit -e audit_report_dir="$work/policy" \
    -e '{"audit_fail_on": ["store_unavailable", "capacity_loss_pct>99", "hosts_unreachable>=1"]}'; then
  echo "FAIL: audit_fail_on store_unavailable did not fail the job"; exit 1
fi
check policy --report "$work/policy/fleet-audit.json" --violated store_unavailable "hosts_unreachable>=1"
# A misspelt policy fails before any host is audited.
if playbook hypeman.vgpu.audit -e audit_report_dir="$work/typo" -e '{"audit_fail_on": ["store_unavalable"]}' \
    > "$work/typo.log" 2>&1; then
  echo "FAIL: an unknown policy was accepted"; exit 1
fi
grep -q "unknown policy 'store_unavalable'" "$work/typo.log"
test ! -e "$work/typo"

# AWX runs playbooks with ansible-runner: the set_stats summary must arrive as an artifact.
mkdir -p "$work/runner"
check runner --private-dir "$work/runner" --inventory "$work/inventory.json" --expected "$work/expected.json" \
  --playbook "$(fixture root)/playbooks/audit.yml"

# Prometheus textfiles, one per host (in each tree here), idempotent.
for dir in "$work"/hosts/*/; do mkdir -p "$dir/prom"; done
prom_dir='{{ hypeman_vgpu_data_dir | dirname | dirname | dirname }}/prom'
playbook hypeman.vgpu.audit -e audit_report_dir="$work/prom-report" -e "audit_prometheus_dir=$prom_dir"
check prometheus --dir "$work" --expected "$work/expected.json"
# The second audit into the same report directory also has a history: an old file beyond the keep
# (deleted), a garbage one within it (skipped with a warning), the first audit's record.
printf 'old' > "$work/prom-report/history/fleet-audit-20000101T000000Z.json"
printf '\377garbage' > "$work/prom-report/history/fleet-audit-20000102T000000Z.json"
# The audit reads each textfile back: an unchanged one is not touched (its write skipped, no module
# run); one whose mode or text drifted is written again.
chmod 0600 "$work/hosts/ok-000/prom/hypeman_vgpu.prom"
echo 'stale 1' >> "$work/hosts/legacy-001/prom/hypeman_vgpu.prom"
playbook hypeman.vgpu.audit -e audit_report_dir="$work/prom-report" -e "audit_prometheus_dir=$prom_dir" \
  -e audit_history_keep=3 2>&1 | tee "$work/prom-again.log"
test "$(grep -E 'changed=[1-9]' "$work/prom-again.log" | cut -d' ' -f1 | sort | tr '\n' ' ')" = "legacy-001 ok-000 " \
  || { echo "FAIL: the textfiles rewritten are not exactly the two that drifted"; exit 1; }
test "$(stat -c %a "$work/hosts/ok-000/prom/hypeman_vgpu.prom")" = 644
test "$(sed -n '/TASK .*Write the node_exporter textfile/,/^TASK/p' "$work/prom-again.log" | grep -c '^skipping: ')" = 12 \
  || { echo "FAIL: unchanged textfiles were not skipped"; exit 1; }
check prometheus --dir "$work" --expected "$work/expected.json"
grep -q 'skipped fleet report history file .*fleet-audit-20000102T000000Z.json' "$work/prom-again.log"
check history --report "$work/prom-report/fleet-audit.json" --points 2 \
  --skipped fleet-audit-20000102T000000Z.json --deleted fleet-audit-20000101T000000Z.json
for dir in "$work"/hosts/*/; do rm -rf "$dir/prom"; done
# The setting on one host only (its own inventory variable): the play cannot end for all hosts at
# once, each host decides for itself; that host gets its textfile, no other host one.
for dir in "$work"/hosts/*/; do mkdir -p "$dir/prom"; done
"$py" -c 'import json, sys
inventory = json.load(open(sys.argv[1]))
inventory["all"]["hosts"]["ok-000"]["audit_prometheus_dir"] = sys.argv[3]
json.dump(inventory, open(sys.argv[2], "w"))' "$work/inventory.json" "$work/inventory-one-prom.json" "$prom_dir"
ansible-playbook -i "$work/inventory-one-prom.json" hypeman.vgpu.audit -e audit_report_dir="$work/one-prom" \
  | tee "$work/one-prom.log"
grep -q 'Keep the metrics sample and the result for a separate report job' "$work/one-prom.log"
test -s "$work/hosts/ok-000/prom/hypeman_vgpu.prom"
test "$(find "$work"/hosts/*/prom -type f | wc -l)" = 1
for dir in "$work"/hosts/*/; do rm -rf "$dir/prom"; done

# Reconcile in check mode: plans the repairs, changes nothing.
fixture checksum --dir "$work" > "$work/tree-3.json"
playbook hypeman.vgpu.reconcile --check -e audit_report_dir="$work/reconcile-check"
fixture checksum --dir "$work" > "$work/tree-4.json"
check same-tree "$work/tree-3.json" "$work/tree-4.json"

# Reconcile: the safe repairs, each listed; then again: nothing left to do.
playbook hypeman.vgpu.reconcile -e audit_report_dir="$work/reconcile"
check reconcile --report "$work/reconcile/fleet-reconcile.json" --expected "$work/expected.json"
check repaired --report "$work/reconcile/fleet-reconcile.json" --expected "$work/expected.json" --dir "$work"
fixture checksum --dir "$work" > "$work/tree-5.json"
playbook hypeman.vgpu.reconcile -e audit_report_dir="$work/reconcile-2"
check reconcile --second-run --report "$work/reconcile-2/fleet-reconcile.json" --expected "$work/expected.json"
fixture checksum --dir "$work" > "$work/tree-6.json"
check same-tree "$work/tree-5.json" "$work/tree-6.json"
# Current hypeman (docs/hypeman-versions.md): guests print no markers, hypeman's vsock sentinel polls
# them and records by itself, /metrics shows its counters. The audit must say so, never read the
# silence of the logs as health, read hypeman's own sentinel, and raise sentinel_coverage_lost.
vwork="$work/vsock"
mkdir -p "$vwork"
fixture build --dir "$vwork" --hosts vsock > /dev/null
vhost=vsock-000
# Run directly (not through the fixture function, whose subshell a kill would
# leave behind) and away from our stdout: ansible-test reads it until EOF.
"$py" "$here/fleet_fixture.py" serve --dir "$vwork" --host "$vhost" --port-file "$vwork/metrics.port" \
  > "$vwork/serve.log" 2>&1 &
serve_pid=$!
for _ in $(seq 300); do [ -s "$vwork/metrics.port" ] && break; sleep 0.1; done
metrics_url="http://127.0.0.1:$(cat "$vwork/metrics.port")/metrics"
vplay() { ansible-playbook -i "$vwork/inventory.json" "$@"; }
vplay hypeman.vgpu.audit -e audit_report_dir="$vwork/no-metrics"
check vsock --report "$vwork/no-metrics/fleet-audit.json" --stage no-metrics
vstate="$vwork/hosts/$vhost/var/lib/hypeman-vgpu"
mkdir -p "$vwork/hosts/$vhost/prom"
vplay hypeman.vgpu.audit -e audit_report_dir="$vwork/covered" -e "hypeman_vgpu_metrics_url=$metrics_url" \
  -e "audit_prometheus_dir=$vwork/hosts/$vhost/prom"
check vsock --report "$vwork/covered/fleet-audit.json" --stage covered --sample "$vstate/sentinel-metrics.json" \
  --prom "$vwork/hosts/$vhost/prom/hypeman_vgpu.prom"
# A guest restarted with an agent that does not answer GetGPUInitStatus: hypeman counts unsupported_agent.
fixture agent --dir "$vwork" --host "$vhost" --instance inst-a --state unsupported
for _ in $(seq 300); do
  "$py" -c 'import sys, urllib.request; sys.exit(b"unsupported_agent" not in urllib.request.urlopen(sys.argv[1]).read())' \
    "$metrics_url" && break
  sleep 0.1
done
if vplay hypeman.vgpu.audit -e audit_report_dir="$vwork/lost" -e "hypeman_vgpu_metrics_url=$metrics_url" \
    -e '{"audit_fail_on": ["sentinel_coverage_lost"]}'; then
  echo "FAIL: audit_fail_on sentinel_coverage_lost did not fail the job"; exit 1
fi
check vsock --report "$vwork/lost/fleet-audit.json" --stage lost
check policy --report "$vwork/lost/fleet-audit.json" --violated sentinel_coverage_lost
echo "fleet_audit: all checks passed"
