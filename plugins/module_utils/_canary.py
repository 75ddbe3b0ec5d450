# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The canary instance that proves a recovered card initialises a vGPU (stdlib and ``_api`` only).

hypeman's runbook ends with "verify by booting a GPU instance"
(docs/hypeman-interface.md §8, §12). hypeman's API cannot pin a card or a VF
(``CreateInstanceRequest.gpu`` carries only ``profile``, §12.1), so the
canary is created only when the placement what-if says hypeman would put the
profile on the recovered card, and where it landed is read back before its
verdict counts. Its verdict comes from the channel the host's hypeman uses
(§5): the guest agent's console markers (marker era), or hypeman's own
record in the store plus the vsock-era agent's console lines (vsock era).
Every canary carries the tag :data:`TAG_KEY` and a name starting with the
operator's prefix, so a canary left by an interrupted run is found and
deleted by the next one.
"""

from __future__ import annotations

import os
import re
import time

from ansible_collections.hypeman.vgpu.plugins.module_utils import _fileio, _sentinel
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError

TAG_KEY = "hypeman.vgpu/canary"
# hypeman's CreateInstanceRequest.name: lowercase letters, digits and dashes, no dash at either end, 63 at most.
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?\Z")
NAME_MAX = 63
# The time suffix a canary name ends with: base-36 nanoseconds (13 characters until the year 2087).
_SUFFIX_LEN = 13
PREFIX_MAX = NAME_MAX - len("-0000-00-00-0-") - _SUFFIX_LEN
# The card and time after "<prefix>-" in a canary name (card address with dashes, base-36 ns).
_NAME_TIME_RE = re.compile(r"^[0-9a-f]{4}-[0-9a-f]{2}-[0-9a-f]{2}-[0-7]-([0-9a-z]{1,%d})\Z" % _SUFFIX_LEN)
TIMEOUT_MAX = 7200  # seconds a run waits for the verdict at most
# Another card's canary is a leftover only past this age: twice the longest wait, so
# never one a run is still watching.
STALE_AFTER_NS = 2 * TIMEOUT_MAX * 10 ** 9
# hypeman's Tags values: ^[A-Za-z0-9 _.:/=+@-]*$, at most 256.
_TAG_VALUE_RE = re.compile(r"^[A-Za-z0-9 _.:/=+@-]{0,256}\Z")
# An instance id we put into a URL path and a host path: CUID2 in practice; one safe path component always.
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}\Z")
# The console bytes read per look: the canary's own console is KiBs; a workload flooding it is cut to its tail.
CONSOLE_LIMIT = 4 * 1024 * 1024
CONSOLE_LOGS = ("app.log.1", "app.log")

VERDICTS = ("passed", "failed", "timeout")
_VSOCK_OK_RE = re.compile(rb"^[0-9]{4}/[0-9]{2}/[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2} \[guest-agent\] "
                          rb"GPU driver initialized\r?\Z")
_VSOCK_FAILED_RE = re.compile(rb"^[0-9]{4}/[0-9]{2}/[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2} \[guest-agent\] "
                              rb"GPU init failure detected: ([^\r\n]*)\r?\Z")


def canary_name(prefix, gpu, now_ns=None):
    """``<prefix>-<card address with dashes>-<base-36 time>``: unique, hypeman-valid, names the card."""
    card = _card_part(gpu)
    value = int(time.time_ns() if now_ns is None else now_ns)
    digits = ""
    while value:
        value, rest = divmod(value, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[rest] + digits
    return "%s-%s-%s" % (prefix, card, digits or "0")


def prefix_problem(prefix):
    """Why ``prefix`` cannot start a canary name, or None."""
    if not isinstance(prefix, str) or not NAME_RE.match(prefix) or len(prefix) > PREFIX_MAX:
        return ("name_prefix %r is not usable; expected 1 to %d lowercase letters, digits and dashes, not starting "
                "or ending with a dash (hypeman's instance name rule)" % (prefix, PREFIX_MAX))
    return None


def text_problem(option, value, limit=512):
    """Why a text option (image, profile, hypervisor) is not usable, or None."""
    if not isinstance(value, str) or not value.strip():
        return "%s is empty; expected a non-empty string" % option
    if len(value) > limit:
        return "%s is %d characters long; expected at most %d" % (option, len(value), limit)
    if any(ord(char) < 32 or ord(char) == 127 for char in value):
        return "%s %r contains a control character" % (option, value[:80])
    return None


def create_body(name, image, profile, gpu, hypervisor=None):
    """hypeman's ``CreateInstanceRequest`` for the canary (§12.1)."""
    if not _TAG_VALUE_RE.match(gpu):
        raise VgpuError("card address %r cannot be a hypeman tag value" % gpu)
    body = {"name": name, "image": image, "gpu": {"profile": profile}, "tags": {TAG_KEY: gpu}}
    if hypervisor:
        body["hypervisor"] = hypervisor
    return body


def instance_view(data, what):
    """The fields of a hypeman ``Instance`` the canary relies on; VgpuError for an answer that is not one."""
    if not isinstance(data, dict):
        raise VgpuError("%s: expected a JSON object (an Instance), got %s" % (what, type(data).__name__))
    inst_id = data.get("id")
    if not isinstance(inst_id, str) or not _ID_RE.match(inst_id):
        raise VgpuError("%s: the instance id %r is not an id hypeman gives (one path component of letters, "
                        "digits, '-' or '_')" % (what, inst_id if not isinstance(inst_id, str) else inst_id[:80]))
    gpu = data.get("gpu") if isinstance(data.get("gpu"), dict) else {}
    tags = data.get("tags") if isinstance(data.get("tags"), dict) else None
    return {"id": inst_id, "name": data.get("name") if isinstance(data.get("name"), str) else None,
            "state": data.get("state") if isinstance(data.get("state"), str) else None,
            "profile": gpu.get("profile") if isinstance(gpu.get("profile"), str) else None,
            "device_path": gpu.get("device_path") if isinstance(gpu.get("device_path"), str) else None,
            "tags": tags}


def _card_part(gpu):
    return gpu.replace(":", "-").replace(".", "-")


def is_leftover(item, prefix, gpu, now_ns=None):
    """Whether a listed instance is a canary of this collection for card ``gpu``, or a stale one of any card.

    Ours: the name ``<prefix>-<card>-<time>`` and, when hypeman sends tags, our
    tag. Another card's canary may belong to a run going on now, so it counts
    only once its name's time is older than any run lasts (STALE_AFTER_NS).
    """
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return False
    name = item["name"]
    if not name.startswith(prefix + "-"):
        return False
    tags = item.get("tags")
    if tags is not None and not (isinstance(tags, dict) and isinstance(tags.get(TAG_KEY), str)):
        return False
    if name.startswith("%s-%s-" % (prefix, _card_part(gpu))) and (tags is None or tags[TAG_KEY] == gpu):
        return True
    born = _NAME_TIME_RE.match(name[len(prefix) + 1:])
    if born is None:
        return False
    now = time.time_ns() if now_ns is None else now_ns
    return now - int(born.group(1), 36) > STALE_AFTER_NS


class Client(object):
    """hypeman's instance endpoints as the canary uses them; every failure a VgpuError naming the call."""

    def __init__(self, base_url, token=None, validate_certs=True, timeout=10):
        self.base_url, self.token, self.validate_certs, self.timeout = base_url, token, validate_certs, timeout

    def _call(self, method, path, body=None):
        from ansible_collections.hypeman.vgpu.plugins.module_utils import _api  # lazy: it loads the HTTP client
        return _api.api_request(method, self.base_url, path, self.token, self.validate_certs, self.timeout,
                                body=body)

    def list_instances(self):
        answer = self._call("GET", "/instances")
        if answer["error"]:
            raise VgpuError("cannot list hypeman's instances: %s" % answer["error"])
        from ansible_collections.hypeman.vgpu.plugins.module_utils import _api  # lazy: it loads the HTTP client
        listed = _api.api_instances(answer["data"])
        if listed is None:
            raise VgpuError("GET %s: expected a JSON list of instances" % answer["url"])
        return listed

    def find_by_name(self, name):
        """Instances named ``name`` (a create whose answer was lost may still have made one)."""
        found = []
        for item in self.list_instances():
            if isinstance(item, dict) and item.get("name") == name:
                found.append(instance_view(item, "GET /instances"))
        return found

    def create(self, body):
        """``(instance view or None, answer)``: None when hypeman refused or the answer is unusable."""
        answer = self._call("POST", "/instances", body)
        if answer["error"]:
            return None, answer
        try:
            return instance_view(answer["data"], "POST %s" % answer["url"]), answer
        except VgpuError as err:
            return None, dict(answer, error=err.msg)

    def get(self, inst_id):
        """The instance, or None when hypeman answers 404."""
        answer = self._call("GET", "/instances/%s" % inst_id)
        if answer["status"] == 404:
            return None
        if answer["error"]:
            raise VgpuError("cannot read canary %s: %s" % (inst_id, answer["error"]))
        return instance_view(answer["data"], "GET %s" % answer["url"])

    def delete(self, inst_id):
        """Delete and make sure it is gone; True when it existed. A 404 is already gone."""
        answer = self._call("DELETE", "/instances/%s" % inst_id)
        if answer["status"] == 404:
            return False
        if answer["error"]:
            raise VgpuError("cannot delete canary %s: %s" % (inst_id, answer["error"]))
        if self.get(inst_id) is not None:
            raise VgpuError("canary %s is still listed by hypeman after DELETE answered %s"
                            % (inst_id, answer["status"]))
        return True


def read_console(log_dir, limit=CONSOLE_LIMIT):
    """The canary's console bytes (``app.log.1`` then ``app.log``), the last ``limit`` bytes of each.

    Refuses symlinked instance or log directories and logs (no following out
    of hypeman's data dir), never blocks on a FIFO. A missing log is empty.
    """
    if not os.path.lexists(log_dir):
        return b""  # not booted yet
    try:
        dir_fd = _sentinel.open_log_dir(log_dir)
    except _sentinel.LogError as err:
        raise VgpuError("cannot read the canary's console: %s" % err)
    chunks = []
    try:
        for name in CONSOLE_LOGS:
            try:
                fd, st = _fileio.open_regular(name, follow=False, dir_fd=dir_fd)
            except FileNotFoundError:
                continue
            except OSError as err:
                raise VgpuError("cannot read %s: %s" % (os.path.join(log_dir, name), err.strerror or err))
            try:
                start = max(0, st.st_size - limit)
                chunks.append(os.pread(fd, st.st_size - start, start))
            finally:
                os.close(fd)
    finally:
        os.close(dir_fd)
    return b"\n".join(chunks)


def console_verdict(data, mode="auto"):
    """``(verdict, evidence, era)`` from console bytes: the last GPU init line decides; ``(None, None, None)``.

    ``mode``: ``markers`` reads only the marker era's ``HYPEMAN-GPU-INIT-*``
    lines (hypeman's anchored patterns), ``vsock`` only the vsock-era agent's
    ``GPU driver initialized`` / ``GPU init failure detected:``, ``auto`` both.
    """
    last = (None, None, None)
    for line in data.split(b"\n"):
        if len(line) >= _sentinel.MAX_LINE_BYTES or b"[guest-agent] " not in line:
            continue
        if mode in ("auto", "markers"):
            marker = _sentinel.match_marker(line)
            if marker is not None:
                text = line.rstrip(b"\r").decode("utf-8", "replace")
                last = ("passed" if marker.verdict == "ok" else "failed", text, "markers")
                continue
        if mode in ("auto", "vsock"):
            if _VSOCK_OK_RE.match(line) or _VSOCK_FAILED_RE.match(line):
                text = line.rstrip(b"\r").decode("utf-8", "replace")
                last = ("passed" if _VSOCK_OK_RE.match(line) else "failed", text, "vsock")
    return last


def store_failure(store, vf, instance_id):
    """hypeman's own record of a failed GPU init of this assignment (vsock era records it itself), or None."""
    record = store.records.get(vf) if store is not None and store.valid else None
    for failure in record.failures if record else ():
        if failure.instance_id == instance_id:
            return failure
    return None
