#!/usr/bin/env bash
# Build, once and cached, the simulated vGPU host image for molecule and the
# demo: a debootstrap'ed Debian bookworm with systemd and python3 (no
# container registry is reachable, so no FROM debian), topped with the
# simulator (tests/sim) and its units hypeman.service, nvidia-dcgm.service,
# nvidia-dcgm-exporter.service.
#
# Two layers, each keyed by a hash of its inputs, so a simulator change costs
# a few seconds and only a base-recipe change repeats the debootstrap:
#   localhost/hypeman-vgpu-sim-base:<base-key>   debootstrap rootfs, imported
#   localhost/hypeman-vgpu-sim:<image-key>       + simulator + units (podman build)
# The final image is also tagged :latest. Older keys are removed.
#
# Usage: scripts/sim_image.sh [--force] [--print]
#   --force  rebuild both layers
#   --print  only print the image reference the current inputs map to
# The last line printed on stdout is the image reference.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

cache=${VGPU_SIM_CACHE:-/var/cache/hypeman-vgpu-sim}
suite=bookworm
mirror=${VGPU_SIM_MIRROR:-http://deb.debian.org/debian}
packages=python3,systemd,systemd-sysv,dbus,iproute2,procps,sudo,psmisc
base_repo=localhost/hypeman-vgpu-sim-base
image_repo=localhost/hypeman-vgpu-sim

log() { printf '[sim_image] %s\n' "$*" >&2; }

# shellcheck source=scripts/podman_env.sh
. "$repo/scripts/podman_env.sh"

build_base() { # rootfs-dir
  local dir=$1
  debootstrap --variant=minbase --include="$packages" "$suite" "$dir" "$mirror" >&2
  # A container has no console login and no kernel to tune: skip units that
  # only slow boot or fail without privileges.
  local unit
  for unit in getty@.service serial-getty@.service console-getty.service \
      systemd-udevd.service systemd-udev-trigger.service systemd-modules-load.service \
      systemd-sysctl.service systemd-remount-fs.service sys-kernel-debug.mount \
      sys-kernel-tracing.mount dev-hugepages.mount apt-daily.timer apt-daily-upgrade.timer \
      e2scrub_all.timer fstrim.timer; do
    ln -sf /dev/null "$dir/etc/systemd/system/$unit"
  done
  echo hypeman-sim > "$dir/etc/hostname"
  : > "$dir/etc/machine-id"
  rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
}

hash_of() { sha256sum | cut -c1-16; }

base_key=$( { declare -f build_base; echo "$suite $mirror $packages"; } | hash_of)
# Inputs of the top layer: the base, the Containerfile and units, the simulator, and the
# zipimport patch its python3 loads, with the collection's bytecode cache the patch uses
# (docs/testing.md, "Modules compiled once").
sim_files() {
  find tests/sim -type f -name '*.py' -not -path '*/__pycache__/*' | LC_ALL=C sort
  echo tests/harness/zipimport_compile_once.py
  echo plugins/module_utils/_payload_loader.py  # the harness's code cache is the collection's
  find tests/sim/image -type f | LC_ALL=C sort
}
image_key=$( { echo "$base_key"; sim_files | while read -r f; do echo "$f"; cat "$f"; done; } | hash_of)
base_ref="$base_repo:$base_key"
image_ref="$image_repo:$image_key"

if [ "${1:-}" = "--print" ]; then echo "$image_ref"; exit 0; fi
force=0
[ "${1:-}" = "--force" ] && force=1

have_image() { podman image exists "$1"; }

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9  # one builder at a time; a second caller waits, then finds the cache warm

start=$(date +%s)
if [ "$force" = 1 ] || ! have_image "$base_ref"; then
  log "base $base_ref: debootstrap $suite (cold build)"
  work="$cache/rootfs-$base_key"
  rm -rf "$work"
  t0=$(date +%s)
  build_base "$work"
  t1=$(date +%s)
  tar -C "$work" --numeric-owner -c . | podman import --change 'CMD ["/sbin/init"]' - "$base_ref" >/dev/null
  rm -rf "$work"
  log "base built: debootstrap $((t1 - t0))s, import $(( $(date +%s) - t1 ))s"
else
  log "base $base_ref: cached"
fi

if [ "$force" = 1 ] || ! have_image "$image_ref"; then
  log "image $image_ref: building the simulator layer"
  ctx=$(mktemp -d)
  trap 'rm -rf "$ctx"' EXIT
  cp -a tests/sim/image/. "$ctx/"
  mkdir -p "$ctx/opt/tests/sim"
  : > "$ctx/opt/tests/__init__.py"
  sim_files | grep '\.py$' | while read -r f; do
    mkdir -p "$ctx/opt/$(dirname "$f")"
    cp "$f" "$ctx/opt/$f"
  done
  podman build -q --build-arg "BASE=$base_ref" -t "$image_ref" -f "$ctx/Containerfile" "$ctx" >/dev/null
  log "image built"
else
  log "image $image_ref: cached"
fi
podman tag "$image_ref" "$image_repo:latest"

# Keep the cache bounded: drop images of other keys. Never with -f: that
# would also remove containers still running an older image (another run's).
podman images --format '{{.Repository}}:{{.Tag}}' | while read -r ref; do
  case "$ref" in
    "$base_repo":*) [ "$ref" = "$base_ref" ] || podman rmi "$ref" >/dev/null 2>&1 || true ;;
    "$image_repo":*)
      [ "$ref" = "$image_ref" ] || [ "$ref" = "$image_repo:latest" ] \
        || podman rmi "$ref" >/dev/null 2>&1 || true ;;
  esac
done
log "ready in $(( $(date +%s) - start ))s"
echo "$image_ref"
