# shellcheck shell=bash
# Shared by scripts/bootstrap.sh and scripts/bootstrap_molecule.sh (sourced;
# the caller defines log()). Each step checks before it acts.

# What molecule, podman and the simulated-host image need from apt.
# shellcheck disable=SC2034  # used by the scripts that source this file
molecule_apt_packages=(debootstrap podman runc containernetworking-plugins uidmap systemd-container iproute2 psmisc)

apt_ensure() { # package...: install the ones that are missing
  local pkg missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
  done
  [ "${#missing[@]}" -gt 0 ] || return 0
  log "apt: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

make_venv() { # dir python requirements: (re)create the venv unless its stamp matches
  local dir=$1 python=$2 req=$3 stamp included
  stamp="$dir/.requirements.sha256"
  if [ -x "$dir/bin/python" ] && [ -f "$stamp" ] && sha256sum --status -c "$stamp" 2>/dev/null; then
    return 0
  fi
  log "venv: $dir ($("$python" --version 2>&1), $req)"
  rm -rf "$dir"
  "$python" -m venv "$dir"
  "$dir/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
  # requirements files may include others (-r): stamp them all.
  mapfile -t included < <(sed -n 's/^-r[[:space:]]*//p' "$req")
  sha256sum "$req" "${included[@]}" > "$stamp"
}

# The test venvs (make test) load tests/harness/zipimport_compile_once.py at interpreter
# start, but only where its marker exists: scripts/test.sh creates it in the private /tmp
# of its integration phases (docs/testing.md, "Modules compiled once").
make_test_venv() { # dir python requirements
  make_venv "$@"
  local harness marker=/tmp/.hypeman-vgpu-zipimport-compile-once name=hypeman_vgpu_zipimport_compile_once site
  harness="$(pwd)/tests/harness/zipimport_compile_once.py"
  site=$("$1/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  printf 'import os; os.path.exists("%s") and exec(compile(open("%s").read(), "%s", "exec"), {"__name__": "%s", "__file__": "%s"})\n' \
    "$marker" "$harness" "$harness" "$name" "$harness" > "$site/$name.pth"
}

# Independent steps at the same time: pip downloads and unpacks, debootstrap
# waits on the mirror; one after another they left both CPUs idle most of the
# time. Each step's output goes to its own log, printed when it ends.
parallel_steps_start() { # name command...: start a step in the background
  local name=$1; shift
  [ -n "${parallel_dir:-}" ] || parallel_dir=$(mktemp -d)
  # errexit stays on inside the step (make_venv relies on it); the trap records how it ended.
  # shellcheck disable=SC2016  # expanded when the step ends
  ( trap 'echo "$? $SECONDS" > "$parallel_dir/'"$name"'.rc"' EXIT; SECONDS=0; "$@" ) \
    > "$parallel_dir/$name.log" 2>&1 &
  parallel_pids+=("$!:$name")
}
parallel_steps_wait() { # wait for every started step; fails if any failed
  local entry name failed=0
  for entry in "${parallel_pids[@]}"; do
    name=${entry#*:}
    wait "${entry%%:*}" || failed=1
    cat "$parallel_dir/$name.log"
    log "$name: exit $(cut -d' ' -f1 "$parallel_dir/$name.rc" 2>/dev/null || echo '?') after $(cut -d' ' -f2 "$parallel_dir/$name.rc" 2>/dev/null || echo '?')s"
  done
  rm -rf "$parallel_dir"
  parallel_pids=() parallel_dir=""
  return "$failed"
}
