# Sourced by scripts/molecule.sh and scripts/demo.sh: the environment in which
# molecule, ansible-playbook and podman run against the simulated host.
# shellcheck shell=bash
vgpu_sim_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export VGPU_SIM_CACHE=${VGPU_SIM_CACHE:-/var/cache/hypeman-vgpu-sim}
# shellcheck source=scripts/podman_env.sh
. "$vgpu_sim_repo/scripts/podman_env.sh"
export PATH="$vgpu_sim_repo/.venv-molecule/bin:$PATH"
export VIRTUAL_ENV="$vgpu_sim_repo/.venv-molecule"
# This collection (via bootstrap.sh's symlink layout) + containers.podman and
# ansible.posix unzipped by bootstrap_molecule.sh.
export ANSIBLE_COLLECTIONS_PATH="$vgpu_sim_repo/.collections:$VGPU_SIM_CACHE/collections-ansible-12.3.0"
export ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0 PY_COLORS=0 NO_COLOR=1
# pytest-ansible, if present, clashes with testinfra's options.
export PYTEST_ADDOPTS="${PYTEST_ADDOPTS:-} -p no:pytest-ansible"
# containers.podman's connection with pipelining: one `podman exec` per module
# run instead of two plus a `podman mount` (extensions/molecule/connection_plugins).
# VGPU_SIM_PIPELINING=0 keeps containers.podman's own (to compare).
if [ "${VGPU_SIM_PIPELINING:-1}" != 0 ]; then
  export ANSIBLE_CONNECTION_PLUGINS="$vgpu_sim_repo/extensions/molecule/connection_plugins"
fi
# Each container's command runner socket (tests/sim/exec_agent.py) lives in
# $VGPU_SIM_EXEC_DIR/<container>/ (resources/create.yml mounts it); empty, every
# command goes through podman exec.
export VGPU_SIM_EXEC_DIR=${VGPU_SIM_EXEC_DIR-/run/hypeman-vgpu-sim-exec}
