"""Offline stand-in for ansible-test's get-pip bootstrap script.

ansible-test runs ``python get_pip.py [pip options] packages...``; we bring pip
in with ensurepip and install the requested packages from the reachable index.
"""

import subprocess
import sys

IGNORED = {"--no-setuptools", "--no-wheel"}


def main():
    subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"])
    args = [a for a in sys.argv[1:] if a not in IGNORED]
    if args:
        subprocess.check_call([sys.executable, "-m", "pip", "install"] + args)


if __name__ == "__main__":
    main()
