#!/usr/bin/env bash
# Build the collection tarball, install it into a scratch path and check that
# ansible-doc renders every module from the installed copy (not the work tree).
set -euo pipefail
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
ansible-galaxy collection build --force --output-path "$out" . >/dev/null
tarball=$(ls "$out"/hypeman-vgpu-*.tar.gz)
echo "built $(basename "$tarball") ($(du -k "$tarball" | cut -f1) KiB)"
if tar -tzf "$tarball" | grep -E '(^|/)(\.venv|\.collections|\.hypothesis|\.pytest_cache|tests/output|bench|build)/' ; then
  echo "tarball carries files build_ignore should drop" >&2; exit 1
fi
export ANSIBLE_COLLECTIONS_PATH="$out/install"
ansible-galaxy collection install --offline -p "$out/install" "$tarball" >/dev/null
test -f "$out/install/ansible_collections/hypeman/vgpu/MANIFEST.json" || { echo "install left no MANIFEST.json" >&2; exit 1; }
n=0
listed=""
if compgen -G 'plugins/modules/*.py' >/dev/null; then
  listed=$(ansible-doc -t module -l hypeman.vgpu | awk '{print $1}')
fi
for file in plugins/modules/*.py; do
  [ -e "$file" ] || continue
  mod=$(basename "$file" .py)
  echo "$listed" | grep -qx "hypeman.vgpu.$mod" || { echo "ansible-doc -l does not list hypeman.vgpu.$mod" >&2; exit 1; }
  ansible-doc -t module "hypeman.vgpu.$mod" > "$out/$mod.txt"
  if ! grep -q 'EXAMPLES' "$out/$mod.txt" || ! grep -q 'RETURN VALUES' "$out/$mod.txt"; then
    echo "ansible-doc hypeman.vgpu.$mod lacks examples or return values" >&2; exit 1
  fi
  n=$((n + 1))
done
for dir in roles/*/; do
  [ -d "$dir" ] || continue
  ansible-doc -t role "hypeman.vgpu.$(basename "$dir")" >/dev/null
  n=$((n + 1))
done
echo "ansible-doc rendered $n plugins/roles from the installed tarball"
