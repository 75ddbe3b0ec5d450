# shellcheck shell=bash
# Shared by scripts/bootstrap.sh and scripts/bootstrap_molecule.sh (sourced;
# the caller defines log()). Each step checks before it acts.

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
