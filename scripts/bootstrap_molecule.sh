#!/usr/bin/env bash
# Install what the molecule scenarios and `make demo` need on a fresh Debian 12
# machine (as root), on top of scripts/bootstrap.sh:
#   apt   debootstrap (the image; no registry is reachable), podman + runc
#         (molecule's podman driver), systemd-container, iproute2, psmisc;
#   venv  .venv-molecule from requirements-molecule.txt (molecule, its
#         podman driver, testinfra, and the dev tools);
#   collections containers.podman and ansible.posix, which Galaxy cannot
#         serve here: unzipped from the `ansible` wheel on PyPI into a cache
#         directory that scripts/molecule_env.sh puts on ANSIBLE_COLLECTIONS_PATH.
# Re-running is cheap: every step checks before it acts.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[bootstrap-molecule] %s\n' "$*"; }
cache=${VGPU_SIM_CACHE:-/var/cache/hypeman-vgpu-sim}
ansible_wheel_version=12.3.0
collections=(containers/podman ansible/posix awx/awx)

# shellcheck source=scripts/bootstrap_lib.sh
. scripts/bootstrap_lib.sh
apt_ensure "${molecule_apt_packages[@]}"

venv=.venv-molecule
make_venv "$venv" "$(command -v python3.11 || command -v python3)" requirements-molecule.txt

coll_dir="$cache/collections-ansible-$ansible_wheel_version"
# The marker names the collection list, so adding one re-extracts the cache.
marker="$coll_dir/.complete-$(printf '%s ' "${collections[@]}" | sha256sum | cut -c1-12)"
if [ ! -f "$marker" ]; then
  log "collections: ${collections[*]} from the ansible $ansible_wheel_version wheel"
  dl=$(mktemp -d)
  trap 'rm -rf "$dl"' EXIT
  "$venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps \
    -d "$dl" "ansible==$ansible_wheel_version"
  rm -rf "$coll_dir"
  mkdir -p "$coll_dir"
  patterns=()
  for c in "${collections[@]}"; do patterns+=("ansible_collections/$c/*"); done
  "$venv/bin/python" - "$dl"/ansible-*.whl "$coll_dir" "${patterns[@]}" <<'PY'
import fnmatch, sys, zipfile
wheel, dest, patterns = sys.argv[1], sys.argv[2], sys.argv[3:]
with zipfile.ZipFile(wheel) as zf:
    names = [n for n in zf.namelist() if any(fnmatch.fnmatch(n, p) for p in patterns)]
    zf.extractall(dest, names)
print("%d files" % len(names))
PY
  touch "$marker"
fi
log "ready: $venv, collections in $coll_dir"
