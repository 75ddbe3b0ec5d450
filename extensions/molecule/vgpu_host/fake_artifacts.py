# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Test equipment, run in the container at prepare time: FAKE NVIDIA driver artifacts and a fake DCGM package.

Nothing here is NVIDIA software. A fake driver "install" writes the module
version where the simulator's sysfs shows the loaded module
(<sim root>/sys/module/nvidia/version), installs an nvidia-smi stub that
reports it, and appends one line to the install log, so the test can count
installs. Built with dpkg-deb (a .deb), as a shell script honouring
nvidia-installer's --silent (a .run) and as a zip holding a host and a guest
.run (only the host one may be installed). DCGM: a package shipping
nvidia-dcgm.service (the simulator's nv-hostengine stand-in) and a dcgmi stub,
in a flat local apt repository.

usage: fake_artifacts.py OUT_DIR SIM_ROOT INSTALL_LOG VERSION...
"""

from __future__ import annotations

import gzip
import hashlib
import os
import subprocess
import sys
import zipfile

NVIDIA_SMI = """#!/bin/sh
# FAKE nvidia-smi (hypeman.vgpu molecule test): reports the simulated module version.
version=$(cat {sim}/sys/module/nvidia/version) || exit 9
echo "NVIDIA-SMI $version    Driver Version: $version    (FAKE, simulated host)"
"""

INSTALL = """mkdir -p {sim}/sys/module/nvidia
printf '%s\\n' "{version}" > {sim}/sys/module/nvidia/version
echo "{kind} {version}$ARGS" >> {log}
"""

RUN = """#!/bin/sh
# FAKE NVIDIA vGPU host driver installer {version} (not NVIDIA software).
ARGS=""
silent=no
for arg in "$@"; do
  case "$arg" in
    --silent) silent=yes ;;
    --dkms|--no-drm|--accept-license) ;;
    *) echo "unknown option $arg" >&2; exit 2 ;;
  esac
  ARGS="$ARGS $arg"
done
[ "$silent" = yes ] || {{ echo "interactive installer: needs a terminal (use --silent)" >&2; exit 1; }}
cat > /usr/bin/nvidia-smi <<'SMI'
{smi}SMI
chmod 0755 /usr/bin/nvidia-smi
{install}"""

GUEST_RUN = """#!/bin/sh
echo "FAKE guest driver: must never be installed on the host" >&2
exit 1
"""

DCGM_UNIT = """# FAKE DCGM (hypeman.vgpu molecule test): the simulator's nv-hostengine stand-in.
[Unit]
Description=NVIDIA DCGM host engine (FAKE package, vgpu-sim stand-in)

[Service]
Environment=VGPU_SIM_ROOT={sim}
ExecStart=/usr/local/bin/vgpu-sim dcgm --name nv-hostengine
Restart=on-failure
RestartSec=2

[Install]
WantedBy=multi-user.target
"""

DCGMI = """#!/bin/sh
# FAKE dcgmi: answers discovery -l while the fake host engine runs.
[ "$1 $2" = "discovery -l" ] || {{ echo "fake dcgmi: only discovery -l" >&2; exit 2; }}
systemctl is-active -q nvidia-dcgm.service || {{ echo "Error: unable to establish a connection to the specified host: localhost" >&2; exit 255; }}
echo "{cards} GPU(s) found. (FAKE dcgmi)"
"""


def write(path, text, mode=0o644):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(path, mode)


def build_deb(tree, out, package, version, description, postinst=None):
    write(os.path.join(tree, "DEBIAN", "control"),
          "Package: %s\nVersion: %s\nArchitecture: all\nMaintainer: hypeman.vgpu tests <tests@invalid>\n"
          "Description: %s\n" % (package, version, description))
    if postinst:
        write(os.path.join(tree, "DEBIAN", "postinst"), postinst, 0o755)
    path = os.path.join(out, "%s_%s_all.deb" % (package, version))
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", tree, path], check=True,
                   stdout=subprocess.DEVNULL)
    return path


def main(out, sim, log, versions):
    os.makedirs(out, exist_ok=True)
    smi = NVIDIA_SMI.format(sim=sim)
    for version in versions:
        # .deb: postinst "loads" the module; nvidia-smi is a file of the package.
        tree = os.path.join(out, "tree-driver-" + version)
        write(os.path.join(tree, "usr", "bin", "nvidia-smi"), smi, 0o755)
        build_deb(tree, out, "nvidia-vgpu-kvm-fake", version, "FAKE NVIDIA vGPU host driver (test equipment)",
                  "#!/bin/sh\nset -e\n[ \"$1\" = configure ] || exit 0\nARGS=\"\"\n"
                  + INSTALL.format(sim=sim, version=version, kind="deb", log=log))
        run_name = "NVIDIA-Linux-x86_64-%s-vgpu-kvm.run" % version
        run = RUN.format(version=version, smi=smi, install=INSTALL.format(sim=sim, version=version, kind="run", log=log))
        write(os.path.join(out, run_name), run, 0o755)
        with zipfile.ZipFile(os.path.join(out, "NVIDIA-GRID-Linux-KVM-%s.zip" % version), "w") as archive:
            archive.writestr("Host_Drivers/" + run_name, run)
            archive.writestr("Guest_Drivers/NVIDIA-Linux-x86_64-%s-grid.run" % version, GUEST_RUN)
            archive.writestr("README.txt", "FAKE driver bundle (hypeman.vgpu tests)\n")

    cards = len(os.listdir(os.path.join(sim, "sys", "bus", "pci", "devices")))
    repo = os.path.join(out, "dcgm-repo")
    tree = os.path.join(out, "tree-dcgm")
    write(os.path.join(tree, "lib", "systemd", "system", "nvidia-dcgm.service"), DCGM_UNIT.format(sim=sim))
    write(os.path.join(tree, "usr", "bin", "dcgmi"), DCGMI.format(cards=cards), 0o755)
    os.makedirs(repo, exist_ok=True)
    deb = build_deb(tree, repo, "datacenter-gpu-manager-4-core", "4.0.0-1", "FAKE DCGM (test equipment)")
    with open(deb, "rb") as handle:
        data = handle.read()
    control = subprocess.run(["dpkg-deb", "-f", deb], check=True, capture_output=True, text=True).stdout
    packages = "%sFilename: ./%s\nSize: %d\nSHA256: %s\n\n" % (
        control, os.path.basename(deb), len(data), hashlib.sha256(data).hexdigest())
    with open(os.path.join(repo, "Packages"), "w", encoding="utf-8") as handle:
        handle.write(packages)
    with gzip.open(os.path.join(repo, "Packages.gz"), "wt", encoding="utf-8") as handle:
        handle.write(packages)
    release = ["Origin: hypeman-vgpu-tests", "Label: fake-dcgm", "Architectures: all amd64 arm64", "SHA256:"]
    for name in ("Packages", "Packages.gz"):
        with open(os.path.join(repo, name), "rb") as handle:
            blob = handle.read()
        release.append(" %s %d %s" % (hashlib.sha256(blob).hexdigest(), len(blob), name))
    write(os.path.join(repo, "Release"), "\n".join(release) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
