#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: path_access_info
short_description: Who the modules run as, and whether they can use a list of host paths
version_added: 0.1.0
author:
  - hypeman.vgpu contributors (!UNKNOWN)
description:
  - In one run, returns the user the module runs as and, for each path of O(paths), what it is (whether
    it exists, its type, whether that user can read, write and execute or search it) and what keeps the
    user from using it as asked.
  - It replaces an M(ansible.builtin.command) task running C(id) and a loop of M(ansible.builtin.stat) tasks, one module run per
    path, with one module run. A path is looked at as M(ansible.builtin.stat) looks at it. A path that does
    not exist (C(ENOENT)) does not exist. A path that fails with any other error (C(ENOTDIR), C(EACCES),
    C(ELOOP), ...) cannot be looked at. Access is tested with C(access(2)) as the real user, through the
    path, so a symlink's access is that of what it points to.
  - It only reads. Nothing is opened, created or changed.
extends_documentation_fragment:
  - hypeman.vgpu.attributes.info_module
attributes:
  platform:
    description: Runs on the managed host; standard library only.
    support: full
    platforms: posix
options:
  paths:
    description:
      - The paths to look at, in the order their results are returned.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description:
          - An absolute path.
        type: str
        required: true
      type:
        description:
          - What the path must be when it exists. V(file) is a regular file and V(directory) a directory,
            both after following a symlink only with O(paths[].follow=true). V(any) accepts every type.
        type: str
        choices: [any, file, directory]
        default: any
      follow:
        description:
          - Whether a symlink is followed to say what the path is. Without it, a symlink is a symlink
            (never a V(file) or a V(directory)).
        type: bool
        default: false
      access:
        description:
          - The access the user needs when the path exists. V(execute) is search for a directory and is
            checked only when the path is of the asked O(paths[].type).
        type: list
        elements: str
        choices: [read, write, execute]
        default: []
notes:
  - A path that does not exist is never a problem (a caller that needs it creates it, or checks RV(paths[].exists)).
  - A path with O(paths[].type=any) and no O(paths[].access) is only described, never a problem.
  - Below a path already named in RV(problems), a path that cannot be looked at adds nothing (a path
    below a regular file fails with C(ENOTDIR); the file is the problem).
  - This module is not in the C(group/hypeman.vgpu.host) action group. It reads no host-path option, only
    the paths it is given.
seealso:
  - module: ansible.builtin.stat
"""

EXAMPLES = r"""
- name: Prove the run can write its state and find its tool
  hypeman.vgpu.path_access_info:
    paths:
      - path: /var/lib/hypeman-vgpu
        type: directory
        follow: true
        access: [read, write, execute]
      - path: /var/lib/hypeman-vgpu/ledger.jsonl
        type: file
        access: [read, write]
      - path: /usr/lib/nvidia/sriov-manage
        follow: true
  register: access

- name: Refuse a host where something is in the way
  ansible.builtin.assert:
    that:
      - access.uid == 0
      - access.problems == []
    fail_msg: "Cannot use {{ access.problems | join('; ') }} (running as uid={{ access.uid }})."
"""

RETURN = r"""
uid:
  description: The real user id the module runs as (the one C(access(2)) checks).
  returned: always
  type: int
  sample: 0
user:
  description: That user's name, or null when the user database has no entry for it.
  returned: always
  type: str
  sample: root
paths:
  description: One entry per O(paths) item, in the same order.
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: The path, as given.
      type: str
      sample: /var/lib/hypeman-vgpu/ledger.jsonl
    exists:
      description: Whether the path exists; null when it cannot be looked at (see RV(paths[].error)).
      type: bool
      sample: true
    type:
      description:
        - What the path is (after following a symlink with O(paths[].follow=true)), null when it does
          not exist or cannot be looked at.
      type: str
      choices: [file, directory, link, fifo, socket, char, block, other]
      sample: file
    readable:
      description: Whether the user can read it (false when it does not exist).
      type: bool
      sample: true
    writable:
      description: Whether the user can write it (false when it does not exist).
      type: bool
      sample: true
    executable:
      description: Whether the user can execute it, or search it for a directory (false when it does not exist).
      type: bool
      sample: false
    error:
      description: Why it cannot be looked at (the system's error text, such as C(Not a directory)); null otherwise.
      type: str
      sample: null
    problems:
      description:
        - 'What keeps the user from using it as asked, in this order: V(not a directory) or V(not a regular
          file), V(not readable), V(not writable), V(not searchable) (a directory) or V(not executable); or
          V(cannot be looked at: <error>) alone.'
      type: list
      elements: str
      sample: [not a regular file, not writable]
problems:
  description:
    - Each path with problems, as C(<path> (<problem>, <problem>\)), in the order of O(paths).
  returned: always
  type: list
  elements: str
  sample: ["/var/lib/hypeman-vgpu/ledger.jsonl (not a regular file)"]
"""

import errno
import os
import stat

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.hypeman.vgpu.plugins.module_utils import _payload_loader  # pylint: disable=unused-import  # first of ours
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.plugins.module_utils._module import new_module, path_problem, run_module

_TYPES = ((stat.S_ISREG, "file"), (stat.S_ISDIR, "directory"), (stat.S_ISLNK, "link"), (stat.S_ISFIFO, "fifo"),
          (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "char"), (stat.S_ISBLK, "block"))
_WANTED = {"file": ("file", "not a regular file"), "directory": ("directory", "not a directory")}


def _kind(mode):
    for test, name in _TYPES:
        if test(mode):
            return name
    return "other"


def look(path, follow):
    """What ``path`` is, as ansible.builtin.stat sees it: ENOENT is "does not exist", any other error
    "cannot be looked at"; access through the path (os.access follows symlinks, as stat's does)."""
    found = dict(path=path, exists=False, type=None, readable=False, writable=False, executable=False, error=None)
    try:
        info = os.stat(path) if follow else os.lstat(path)
    except OSError as err:
        if err.errno != errno.ENOENT:
            found.update(exists=None, error=err.strerror or str(err))
        return found
    found.update(exists=True, type=_kind(info.st_mode), readable=os.access(path, os.R_OK),
                 writable=os.access(path, os.W_OK), executable=os.access(path, os.X_OK))
    return found


def problems_of(found, wanted, access, named):
    """Why ``found`` cannot be used as asked; ``named``: paths already named as problems."""
    if (wanted == "any" and not access) or found["exists"] is False:
        return []
    if found["error"] is not None:
        # Below a path already named (ENOTDIR under a file, EACCES under a closed directory): nothing new.
        if any(found["path"].startswith(above + "/") for above in named):
            return []
        return ["cannot be looked at: " + found["error"]]
    why = []
    right_type = wanted == "any" or found["type"] == _WANTED[wanted][0]
    if not right_type:
        why.append(_WANTED[wanted][1])
    if "read" in access and not found["readable"]:
        why.append("not readable")
    if "write" in access and not found["writable"]:
        why.append("not writable")
    if "execute" in access and right_type and not found["executable"]:
        why.append("not searchable" if found["type"] == "directory" else "not executable")
    return why


def _user(uid):
    import pwd  # only here: the name is for messages

    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return None


def _body(module):
    results, named, problems = [], [], []
    for index, item in enumerate(module.params["paths"]):
        problem = path_problem(item["path"])
        if problem:
            raise VgpuError("paths[%d].path %s" % (index, problem))
    for item in module.params["paths"]:
        found = look(item["path"], item["follow"])
        found["problems"] = problems_of(found, item["type"], item["access"], named)
        if found["problems"]:
            named.append(item["path"])
            problems.append("%s (%s)" % (item["path"], ", ".join(found["problems"])))
        results.append(found)
    uid = os.getuid()
    return dict(changed=False, uid=uid, user=_user(uid), paths=results, problems=problems)


def main():
    module = new_module(AnsibleModule, argument_spec=dict(
        paths=dict(type="list", elements="dict", default=[], options=dict(
            path=dict(type="str", required=True),
            type=dict(type="str", default="any", choices=["any", "file", "directory"]),
            follow=dict(type="bool", default=False),
            access=dict(type="list", elements="str", default=[], choices=["read", "write", "execute"]),
        )),
    ), supports_check_mode=True)
    run_module(module, _body)


if __name__ == "__main__":
    main()
