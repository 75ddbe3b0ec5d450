#!/usr/bin/env bash
# Install everything `make test` needs on a fresh Debian 12 machine (as root):
# apt packages, pinned venvs, ansible-test's offline pip shim and the
# ansible_collections/hypeman/vgpu layout ansible-test insists on.
# Re-running is cheap: every step checks before it acts.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

log() { printf '[bootstrap] %s\n' "$*"; }

# --- apt -------------------------------------------------------------------
# shellcheck source=scripts/bootstrap_lib.sh
. scripts/bootstrap_lib.sh
# One apt run for both bootstraps (each apt-get update costs seconds).
# `make test` alone (VGPU_TEST_TOOLS=1) needs the tools of its extra checks:
# openjdk for ansible-rulebook's rule engine (the EDA rulebook run, docs/eda.md),
# chromium for the fleet report's browser check (docs/testing.md).
test_apt_packages=()
[ "${VGPU_TEST_TOOLS:-0}" = 1 ] && test_apt_packages=(openjdk-17-jre-headless chromium)
apt_ensure git shellcheck make "${test_apt_packages[@]}" "${molecule_apt_packages[@]}"

# --- venvs -------------------------------------------------------------------
# The venvs, the molecule bootstrap and (for `make test`, VGPU_PREBUILD_IMAGE=1)
# the simulated-host image are independent: they run at the same time.
parallel_pids=()
python311=$(command -v python3.11 || command -v python3)
parallel_steps_start venv-py311 make_test_venv .venv "$python311" requirements-dev.txt
if [ "${VGPU_TEST_TOOLS:-0}" = 1 ]; then
  parallel_steps_start venv-eda make_venv .venv-eda "$python311" requirements-eda.txt
fi

python312=""
for cand in "$(command -v python3.12 || true)" "$(pyenv root 2>/dev/null || echo /root/.pyenv)"/versions/3.12*/bin/python3.12; do
  # pyenv shims exist for versions that are not selected: prove it runs.
  if [ -n "$cand" ] && [ -x "$cand" ] && "$cand" -c 'import sys' >/dev/null 2>&1; then
    python312=$cand; break
  fi
done
if [ -n "$python312" ]; then
  parallel_steps_start venv-py312 make_test_venv .venv-py312 "$python312" requirements-dev-py312.txt
else
  log "python3.12: not found; the ansible-core 2.21 matrix entry will be skipped"
  rm -rf .venv-py312
fi

# --- ansible-test offline pip bootstrap -----------------------------------------
# ansible-test downloads get-pip from a host these machines cannot reach; this
# stand-in uses the interpreter's bundled ensurepip instead.
mkdir -p "$HOME/.ansible/test/cache"
for ver in 24_2 25_2; do
  install -m 0644 scripts/get_pip_offline.py "$HOME/.ansible/test/cache/get_pip_${ver}.py"
done

# --- collection layout -----------------------------------------------------------
mkdir -p .collections/ansible_collections/hypeman
ln -sfn ../../.. .collections/ansible_collections/hypeman/vgpu
# --- molecule, podman, the simulated-host tooling and extra collections ----------------
parallel_steps_start molecule bash scripts/bootstrap_molecule.sh
if [ "${VGPU_PREBUILD_IMAGE:-0}" = 1 ]; then
  # stdout is the image reference; the build is cached for scripts/molecule.sh.
  parallel_steps_start sim-image bash scripts/sim_image.sh
fi
parallel_steps_wait || { log "a step failed (its output is above)"; exit 1; }
log "ready: $repo/.collections/ansible_collections/hypeman/vgpu"
