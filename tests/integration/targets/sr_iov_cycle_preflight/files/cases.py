# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The target's scaffolding in one process each, instead of several module runs per case (test equipment).

    python cases.py setup COLL_ROOT FINGERPRINT_SCRIPT TMP SPEC_JSON_FILE
        SPEC: {"base_layout": {...}, "cases": [...]}. For every case: its host tree
        (tests/sim/hosttree) under TMP/<name>/host, an sriov-manage stub that logs every run
        under TMP/<name>/tool, a local port nothing listens on (case api: free_port) and the
        tree's fingerprint. Prints {name: {tree, sriov_manage, stub_log, port, before}} as JSON.
    python cases.py check FINGERPRINT_SCRIPT TREE_ROOT STATE_DIR STUB_LOG
        After a run: the tree's fingerprint and what the run must not have left (a run of the stub,
        a resume marker directory). Prints {"after": ..., "left": [...]} as JSON.
"""

from __future__ import annotations

import json
import os
import runpy
import socket
import sys

STUB = """#!/bin/sh
# Stand-in for NVIDIA's sriov-manage: records that it ran, does nothing else.
printf '%s\\n' "$*" >> "$(dirname "$0")/sriov-manage.log"
"""


def _free_port():
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
    finally:
        sock.close()


def setup(coll_root, fingerprint_script, tmp, spec_file):
    sys.path.insert(0, coll_root)
    from tests.sim.hosttree import build_from_layout  # pylint: disable=import-outside-toplevel

    fingerprint = runpy.run_path(fingerprint_script)["fingerprint"]
    with open(spec_file) as handle:
        spec = json.load(handle)
    out = {}
    for case in spec["cases"]:
        case_dir = os.path.join(tmp, case["name"])
        tool_dir = os.path.join(case_dir, "tool")
        layout = dict(spec["base_layout"], **(case.get("layout") or {}))
        tree = build_from_layout(os.path.join(case_dir, "host"), layout).describe()
        os.makedirs(tool_dir)
        os.chmod(tool_dir, 0o755)
        stub = os.path.join(tool_dir, "sriov-manage")
        with open(stub, "w") as handle:
            handle.write(STUB)
        tool = case.get("tool") or "stub"
        os.chmod(stub, 0o644 if tool == "not_executable" else 0o755)
        if tool == "symlink":
            os.symlink("sriov-manage", os.path.join(tool_dir, "sriov-manage-link"))
        sriov_manage = tool_dir + {"missing": "/absent/sriov-manage", "directory": "",
                                   "symlink": "/sriov-manage-link"}.get(tool, "/sriov-manage")
        out[case["name"]] = dict(tree=tree, sriov_manage=sriov_manage,
                                 stub_log=os.path.join(tool_dir, "sriov-manage.log"),
                                 port=_free_port() if case.get("api") == "free_port" else None,
                                 before=fingerprint(tree["root"]))
    json.dump(out, sys.stdout, sort_keys=True)
    return 0


def check(fingerprint_script, root, state_dir, stub_log):
    fingerprint = runpy.run_path(fingerprint_script)["fingerprint"]
    # lexists: below a state_dir that is a file nothing can exist (ENOTDIR is "not there").
    left = [path for path in (stub_log, os.path.join(state_dir, "recovery")) if os.path.lexists(path)]
    json.dump({"after": fingerprint(root), "left": left}, sys.stdout, sort_keys=True)
    return 0


def main(argv):
    if argv[:1] == ["setup"] and len(argv) == 5:
        return setup(*argv[1:])
    if argv[:1] == ["check"] and len(argv) == 5:
        return check(*argv[1:])
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
