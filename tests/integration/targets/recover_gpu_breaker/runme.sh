#!/usr/bin/env bash
# The fleet circuit breaker of playbooks/recover_gpu.yml over a simulated
# fleet (fleet_audit's fixture: local connection, one tree per host):
#   ok-000, ok-001: two A100s (16 VFs) each, card A 14 allocatable, card B 16;
#   drained-002:    card B drained (every VF quarantined);
#   novfs-003:      card B left by SR-IOV without VFs (sriov_numvfs 0);
#   invalid-004:    a store hypeman cannot load: placement disabled on both cards;
#   hypeman-005:    healthy, with a hypeman process running (and no unit to stop it);
#   unreachable-000: nothing listens there.
# Every run here must end refused, with every tree unchanged: by the breaker,
# by the input checks, or (once the breaker passes) by sr_iov_cycle's
# preflight, since no host allowlists a card (hypeman_vgpu_allowed_gpus empty).
set -eux
here=$(cd "$(dirname "$0")" && pwd)
fleet="$here/../fleet_audit"
py=$(command -v python)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fixture() { "$py" "$fleet/fleet_fixture.py" "$@"; }
CARD_A=0000:82:00.0
CARD_B=0000:83:00.0
BREAKER="Circuit breaker: recovering would put"
PASSED="is not on this host's allowlist of cards automation may cycle"

fixture build --dir "$work" --hosts ok,ok,drained,novfs,invalid,hypeman --unreachable 1 > /dev/null
fixture checksum --dir "$work" > "$work/tree-0.json"

# refused NAME EXPECTED_RC ARGS...: run the playbook into $work/NAME.log; it must
# exit EXPECTED_RC and leave every tree as it was.
refused() {
  local name=$1 expected_rc=$2 rc=0; shift 2
  ansible-playbook -i "$work/inventory.json" hypeman.vgpu.recover_gpu "$@" > "$work/$name.log" 2>&1 || rc=$?
  cat "$work/$name.log"
  if [ "$rc" != "$expected_rc" ]; then echo "FAIL: $name exited $rc, expected $expected_rc"; exit 1; fi
  fixture checksum --dir "$work" > "$work/tree-$name.json"
  "$py" "$fleet/fleet_checks.py" same-tree "$work/tree-0.json" "$work/tree-$name.json"
}
has() { grep -qF -- "$2" "$work/$1.log" || { echo "FAIL: $1: no '$2'"; exit 1; }; }
lacks() { if grep -qF -- "$2" "$work/$1.log"; then echo "FAIL: $1: unexpected '$2'"; exit 1; fi; }
# Nothing of the recovery play ran (after any_errors_fatal its banners may
# still print, one per serial batch, with no task under them).
no_recovery() {
  lacks "$1" "TASK [Recover GPU | Recover "
  lacks "$1" "TASK [hypeman.vgpu.sr_iov_cycle"
}
# The breaker passed: the first host's role refused the card in preflight.
breaker_passed() {
  lacks "$1" "$BREAKER"
  has "$1" "$2 $PASSED (sr_iov_cycle_allowed_gpus / hypeman_vgpu_allowed_gpus: []). Refusing: nothing was drained or stopped."
  has "$1" "fatal: [$3]: FAILED!"
}

# Cases 1 to 5b recover healthy cards (as if they had a quarantined VF): sr_iov_cycle_force
# makes the breaker count them, as the role would take them out.
FORCE=(-e sr_iov_cycle_force=true)

# 1. A card elsewhere is already drained: recovering card A would put 2 out at once.
#    Fleet: 14 + 16 (x2) + 14 = 74 allocatable; card A gives 14 (18.9%).
fleet3=ok-000,ok-001,drained-002
refused cards 2 -e target_hosts=$fleet3 -e target_gpu=$CARD_A "${FORCE[@]}"
has cards "$BREAKER 2 card(s) out at once (limit max_cards_in_recovery=1; already out: drained-002 $CARD_B) and take 18.9% of the fleet's allocatable slots (limit max_capacity_loss_pct=25.0). Nothing was drained or stopped."
lacks cards "$PASSED"
no_recovery cards

# 2. The same with max_cards_in_recovery=2: the breaker passes.
refused cards-2 2 -e target_hosts=$fleet3 -e target_gpu=$CARD_A -e max_cards_in_recovery=2 "${FORCE[@]}"
has cards-2 "Cards out at once during this run: 2 (limit 2); already out: drained-002 $CARD_B. Largest loss of allocatable slots: 14 of 74 (18.9%, limit 25.0%)."
breaker_passed cards-2 $CARD_A ok-000

# 3. Capacity: card B holds 16 of the two ok hosts' 60 slots (26.7% > 25%).
refused capacity 2 -e target_hosts=ok-000,ok-001 -e target_gpu=$CARD_B "${FORCE[@]}"
has capacity "$BREAKER 1 card(s) out at once (limit max_cards_in_recovery=1; already out: none) and take 26.7% of the fleet's allocatable slots (limit max_capacity_loss_pct=25.0). Nothing was drained or stopped."
lacks capacity "$PASSED"
no_recovery capacity
refused capacity-30 2 -e target_hosts=ok-000,ok-001 -e target_gpu=$CARD_B -e max_capacity_loss_pct=30 "${FORCE[@]}"
has capacity-30 "Cards out at once during this run: 1 (limit 1); already out: none. Largest loss of allocatable slots: 16 of 60 (26.7%, limit 30.0%)."
breaker_passed capacity-30 $CARD_B ok-000
# 3b. The same card needing nothing (no quarantine, no interrupted recovery, no force) is not
#     taken out by the role, so the breaker does not count it: default limits pass.
refused healthy 2 -e target_hosts=ok-000,ok-001 -e target_gpu=$CARD_B
has healthy "Cards out at once during this run: 0 (limit 1); already out: none. Largest loss of allocatable slots: 0 of 60 (0.0%, limit 25.0%). Not counted, as they need no recovery (nothing quarantined, no interrupted recovery): ok-000 $CARD_B, ok-001 $CARD_B."
breaker_passed healthy $CARD_B ok-000

# 4. A card SR-IOV left without VFs is out, like a drained one.
fleet_novfs=ok-000,ok-001,novfs-003
refused novfs 2 -e target_hosts=$fleet_novfs -e target_gpu=$CARD_A "${FORCE[@]}"
has novfs "$BREAKER 2 card(s) out at once (limit max_cards_in_recovery=1; already out: novfs-003 $CARD_B) and take 18.9% of the fleet's allocatable slots (limit max_capacity_loss_pct=25.0). Nothing was drained or stopped."
no_recovery novfs
refused novfs-2 2 -e target_hosts=$fleet_novfs -e target_gpu=$CARD_A -e max_cards_in_recovery=2 "${FORCE[@]}"
breaker_passed novfs-2 $CARD_A ok-000

# 5. Resuming: the target card is the one already out, counted once.
refused resume-drained 2 -e target_hosts=drained-002 -e target_gpu=$CARD_B
has resume-drained "Cards out at once during this run: 1 (limit 1); already out: drained-002 $CARD_B. Largest loss of allocatable slots: 0 of 14 (0.0%, limit 25.0%)."
breaker_passed resume-drained $CARD_B drained-002
refused resume-novfs 2 -e target_hosts=novfs-003 -e target_gpu=$CARD_B
has resume-novfs "Cards out at once during this run: 1 (limit 1); already out: novfs-003 $CARD_B."
breaker_passed resume-novfs $CARD_B novfs-003

# 5b. A host whose store hypeman cannot load places nothing: both its cards are out.
refused invalid 2 -e target_hosts=ok-000,ok-001,invalid-004 -e target_gpu=$CARD_A -e max_cards_in_recovery=2 \
  "${FORCE[@]}"
has invalid "$BREAKER 3 card(s) out at once (limit max_cards_in_recovery=2; already out: invalid-004 $CARD_A, invalid-004 $CARD_B)"
no_recovery invalid

# 6. Missing or wrong inputs: refused in the first play, before any host is read, naming each
#    input as typed and what is expected.
INPUTS="TASK [Recover GPU | Check target_hosts, target_gpu, max_cards_in_recovery and max_capacity_loss_pct]"
NOTHING="Nothing was read or changed on any host."
refused no-hosts 2 -e target_gpu=$CARD_A
has no-hosts "target_hosts is not set; expected a host pattern of the inventory, e.g. -e target_hosts=gpu-07 -e target_gpu=0000:82:00.0. $NOTHING"
refused empty-hosts 2 -e target_hosts= -e target_gpu=$CARD_A
has empty-hosts "target_hosts is not set"
refused typo-hosts 2 -e target_hosts=ok-00 -e target_gpu=$CARD_A
has typo-hosts 'target_hosts "ok-00" matches no host of the inventory; expected a host pattern like gpu-07 or gpu-0*.'
refused no-gpu 2 -e target_hosts=ok-000,ok-001
has no-gpu "target_gpu is not set for ok-000, ok-001; expected a parent GPU PCI address like 0000:82:00.0 (domain:bus:device.function, hex), as -e target_gpu=... or in host_vars. $NOTHING"
refused bad-gpu 2 -e target_hosts=ok-000 -e target_gpu=0000:82:00
has bad-gpu 'target_gpu is "0000:82:00" for ok-000; expected a parent GPU PCI address like 0000:82:00.0 (domain:bus:device.function, hex).'
refused bad-gpu-type 2 -e target_hosts=ok-000 -e '{"target_gpu": ["0000:82:00.0"]}'
has bad-gpu-type 'target_gpu is ["0000:82:00.0"] for ok-000; expected a parent GPU PCI address'
refused bad-limits 2 -e target_hosts=ok-000 -e target_gpu=$CARD_A -e max_cards_in_recovery=two -e max_capacity_loss_pct=150
has bad-limits 'max_cards_in_recovery is "two"; expected a whole number of cards, 1 or more (default 1). max_capacity_loss_pct is "150"; expected a percentage from 0 to 100 (default 25).'
refused zero-cards 2 -e target_hosts=ok-000 -e target_gpu=$CARD_A -e max_cards_in_recovery=0
has zero-cards 'max_cards_in_recovery is "0"; expected a whole number of cards, 1 or more'
for log in no-hosts empty-hosts typo-hosts no-gpu bad-gpu bad-gpu-type bad-limits zero-cards; do
  has $log "$INPUTS"
  lacks $log "sr_iov_cycle_gpu"
  lacks $log "Read each host's cards"
  lacks $log "Cards out at once"
  no_recovery $log
done
# The card may be given upper case or without the domain: it is normalised, and the breaker and
# the role get 0000:82:00.0 (refused here by the allowlist, after the breaker).
refused short-gpu 2 -e target_hosts=ok-000,ok-001 -e target_gpu=82:00.0 -e max_capacity_loss_pct=100
breaker_passed short-gpu $CARD_A ok-000

# 7. A host that cannot be read stops the run before the count, even with
#    limits that would let the others through: never counted as "not out".
refused unreachable 4 -e target_hosts=ok-000,ok-001,unreachable-000 -e target_gpu=$CARD_A \
  -e max_cards_in_recovery=4 -e max_capacity_loss_pct=100
has unreachable "fatal: [unreachable-000]: UNREACHABLE!"
lacks unreachable "Cards out at once"
no_recovery unreachable

# 8. Past the breaker and preflight in check mode (forced, with an allowlist and an sriov-manage):
#    the drain's store edit is refused, since a hypeman process runs and no unit is given to stop
#    it. The failure says so and claims nothing check mode did not write.
past_preflight=(-e target_hosts=hypeman-005 -e "target_gpu=$CARD_B" -e max_capacity_loss_pct=100
  -e sr_iov_cycle_force=true -e sr_iov_cycle_sriov_manage=/usr/bin/true -e "{\"hypeman_vgpu_allowed_gpus\": [\"$CARD_B\"]}")
refused check-mode 2 --check "${past_preflight[@]}"
has check-mode "Check mode: the preview of the recovery of $CARD_B stopped in task \"Store edit | Refuse to edit under a hypeman this role does not stop\": hypeman is running (pid "
has check-mode "| Nothing was changed on the host: no VF was quarantined, nothing was stopped, no resume marker was written."
lacks check-mode "resume marker $work"
lacks check-mode "Left behind"
# The role stops hypeman around its edits itself: the module must not tell the operator to.
lacks check-mode "Stop hypeman before this edit"

# 9. The plays on the hosts escalate (hypeman_vgpu_become): made to become a user that is not
#    root, the breaker still reads the trees and preflight refuses before anything is drained.
chmod 0755 "$work"
refused not-root 2 "${past_preflight[@]}" -e hypeman_vgpu_become=true -e ansible_become_method=su \
  -e ansible_become_user=nobody -e "ansible_become_flags='-s /bin/sh'" -e ansible_python_interpreter=/usr/bin/python3
has not-root "Cards out at once during this run: 1"
has not-root "The modules run as uid=65534(nobody), not root: the recovery stops and starts systemd units"
lacks not-root "Drain |"
# 10. Past preflight for real (ok-001, forced): the drain quarantines card A and waits for its two
#     live instances, every poll naming them and when the wait gives up; it times out, and the
#     failure names what it left: the quarantined VFs and the resume marker (step "started").
rc=0
ansible-playbook -i "$work/inventory.json" hypeman.vgpu.recover_gpu -e target_hosts=ok-001 -e "target_gpu=$CARD_A" \
  -e max_capacity_loss_pct=100 -e sr_iov_cycle_force=true -e sr_iov_cycle_sriov_manage=/usr/bin/true \
  -e "{\"hypeman_vgpu_allowed_gpus\": [\"$CARD_A\"]}" -e sr_iov_cycle_drain_timeout=4 \
  -e sr_iov_cycle_drain_poll_interval=1 > "$work/drain.log" 2>&1 || rc=$?
cat "$work/drain.log"
if [ "$rc" != 2 ]; then echo "FAIL: drain exited $rc, expected 2"; exit 1; fi
waiting="Drain | $CARD_A is held by live instance inst-a; live instance inst-b; 2 VF(s) held open; polling every 1 s until "
has drain "TASK [hypeman.vgpu.gpu_drain : $waiting"
# ansible-core 2.21 puts the role name before a retried task's name, 2.19 does not.
grep -F "$waiting" "$work/drain.log" | grep -F "FAILED - RETRYING: [ok-001]: " | grep -qF "UTC (1 retries left)." \
  || { echo "FAIL: drain: no poll line naming what holds the card"; exit 1; }
has drain "did not drain within 4 s; still there: live instance inst-a; live instance inst-b; 2 VF(s) held open."
has drain "| Left behind: 16 VF(s) of the card quarantined in the store (placement stays closed on them); DCGM units are started again below; resume marker $work/hosts/ok-001/var/lib/hypeman-vgpu/recovery/$CARD_A.json (step \"started\"); no instance was touched. Fix the cause and run again: the next run resumes after \"started\"."
# 11. A forced recovery, for real, of the card SR-IOV left without VFs (novfs-003, card B): the
#     drain says there is nothing to quarantine (not "0 of 0 VFs"), the disable has nothing to do,
#     the enable runs on the host as a background job that every poll names. The sriov-manage
#     stub creates no VF, so the enable fails; the failure names the step, the job and the marker.
stub="$work/sriov-manage"
printf '#!/bin/sh\necho "$*" >> "%s/sriov-manage.calls"\n' "$work" > "$stub"
chmod 0755 "$stub"
rc=0
ansible-playbook -i "$work/inventory.json" hypeman.vgpu.recover_gpu -e target_hosts=novfs-003 -e "target_gpu=$CARD_B" \
  -e sr_iov_cycle_force=true -e "sr_iov_cycle_sriov_manage=$stub" -e sr_iov_cycle_sriov_timeout=1 \
  -e sr_iov_cycle_sriov_retries=0 -e sr_iov_cycle_sriov_poll_interval=1 -e "ansible_async_dir=$work/async" \
  -e "{\"hypeman_vgpu_allowed_gpus\": [\"$CARD_B\"], \"sr_iov_cycle_dcgm_units\": []}" > "$work/novfs-run.log" 2>&1 || rc=$?
cat "$work/novfs-run.log"
if [ "$rc" != 2 ]; then echo "FAIL: novfs-run exited $rc, expected 2"; exit 1; fi
has novfs-run "\"msg\": \"$CARD_B has no VFs now (SR-IOV is off on it, as an interrupted SR-IOV cycle leaves it): nothing to quarantine, and no instance can hold a VF of it.\""
lacks novfs-run "0 of 0 VFs"
has novfs-run "TASK [hypeman.vgpu.sr_iov_cycle : SR-IOV cycle | Enable SR-IOV on $CARD_B (sriov-manage -e, run on the host in the background)]"
has novfs-run "TASK [hypeman.vgpu.sr_iov_cycle : SR-IOV cycle | sriov-manage -e on $CARD_B runs on the host (job "
has novfs-run "Recovery of $CARD_B failed after step \"drained\" in task \"SR-IOV cycle | sriov-manage -e on $CARD_B runs on the host (job "
has novfs-run "sriov-manage -e $CARD_B did not produce working VFs"
has novfs-run "| Left behind: 0 VF(s) of the card quarantined in the store; DCGM units are started again below; resume marker $work/hosts/novfs-003/var/lib/hypeman-vgpu/recovery/$CARD_B.json (step \"drained\")"
if [ "$(cat "$work/sriov-manage.calls")" != "-e $CARD_B" ]; then
  echo "FAIL: sriov-manage ran $(cat "$work/sriov-manage.calls"), expected only -e $CARD_B"; exit 1
fi
echo "recover_gpu_breaker: all checks passed"
