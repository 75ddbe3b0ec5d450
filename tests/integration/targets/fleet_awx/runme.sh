#!/usr/bin/env bash
# The AWX / execution-environment pieces:
#   ansible-builder create accepts docs/awx/execution-environment.yml (offline);
#   ansible-builder's introspection reads the collection's meta/execution-environment.yml;
#   awx/configure.yml passes ansible-playbook --syntax-check with the awx.awx collection.
set -eux
py=$(command -v python)
coll=$("$py" -c 'import os
for base in os.environ["ANSIBLE_COLLECTIONS_PATH"].split(":"):
    path = os.path.join(base, "ansible_collections", "hypeman", "vgpu")
    if os.path.isdir(os.path.join(path, "meta")):
        print(path)
        break')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

command -v ansible-builder || { echo "ansible-builder is not installed: pip install -r requirements-fleet.txt"; exit 1; }
ansible-builder create -f "$coll/docs/awx/execution-environment.yml" --context "$work/ee" --output-filename Containerfile
test -f "$work/ee/Containerfile"
grep -q 'hypeman.vgpu' "$work/ee/_build/requirements.yml"
grep -q 'ansible-core==2.19.14' "$work/ee/Containerfile"
grep -q 'introspect' "$work/ee/Containerfile"

# What ansible-builder adds to the image for this collection, from meta/execution-environment.yml.
mkdir -p "$work/collections/ansible_collections/hypeman"
ln -s "$coll" "$work/collections/ansible_collections/hypeman/vgpu"
"$py" "$work/ee/_build/scripts/introspect.py" introspect "$work/collections" > "$work/introspect.yml"
cat "$work/introspect.yml"
grep -q "openssh-client \[platform:dpkg\]  # from collection hypeman.vgpu" "$work/introspect.yml"
grep -q "openssh-clients \[platform:rpm\]  # from collection hypeman.vgpu" "$work/introspect.yml"

# awx/configure.yml needs awx.awx; Galaxy is unreachable here, so the collection comes
# from the ansible wheel (scripts/bootstrap_molecule.sh unpacks it into this cache).
extra=${HYPEMAN_VGPU_EXTRA_COLLECTIONS:-${VGPU_SIM_CACHE:-/var/cache/hypeman-vgpu-sim}/collections-ansible-12.3.0}
test -d "$extra/ansible_collections/awx/awx" || { echo "awx.awx not found under $extra"; exit 1; }
ANSIBLE_COLLECTIONS_PATH="$ANSIBLE_COLLECTIONS_PATH:$extra" ansible-playbook --syntax-check "$coll/awx/configure.yml"
echo "fleet_awx: all checks passed"
