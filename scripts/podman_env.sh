# Sourced by the simulator scripts: podman settings for these machines.
# podman uses runc (the runtime bootstrap installs). Where the kernel denies
# CAP_SYS_RESOURCE (these VMs), podman's default ulimits cannot be applied and
# every container fails to start: give it lower ones. Elsewhere nothing is
# overridden. Storage stays where podman keeps it (relocating it stalls runs).
# shellcheck shell=bash
vgpu_sim_podman_conf() {
  local cache=${VGPU_SIM_CACHE:-/var/cache/hypeman-vgpu-sim} capeff conf
  capeff=$(awk '/^CapEff:/ {print $2}' /proc/self/status)
  conf="$cache/containers.conf"
  mkdir -p "$cache"
  {
    echo '[engine]'
    echo 'runtime = "runc"'
    # CAP_SYS_RESOURCE is capability 24.
    if [ $(( 0x$capeff >> 24 & 1 )) = 0 ]; then
      echo '[containers]'
      echo 'default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]'
    fi
  } > "$conf.tmp"
  mv "$conf.tmp" "$conf"
  export CONTAINERS_CONF="$conf"
}
vgpu_sim_podman_conf
