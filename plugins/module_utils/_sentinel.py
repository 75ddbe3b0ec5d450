# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Guest-log sentinel: hypeman's guest-agent GPU init markers in serial logs.

Reads each instance's ``logs/app.log`` (plus ``app.log.1`` after a
copytruncate rotation and the ``app.log.prev.<ns>`` archives of earlier boots)
the way hypeman's app.log sentinel did, and keeps a durable cursor per
instance in ``state_dir`` so a later run reads only new bytes. Standard
library only.

Terms used below:

* *marker*: a complete, standalone guest-agent line that hypeman's anchored
  patterns accept (docs/hypeman-interface.md §5.2). Nothing else counts.
* *verdict*: per current assignment (VF, assigned_at), the last attributed
  marker seen so far (``failed`` or ``ok``), plus whether it was recorded in
  the VF health store. Looking at evidence never consumes it: a findings-only
  run moves cursors but leaves the verdict unrecorded for a later
  ``record`` run. An ``ok`` verdict also keeps the ``earlier_failure`` that
  hypeman's sentinel would have reported on a pass of its own before it.
"""

from __future__ import annotations

import base64
import binascii
import errno
import hashlib
import json
import os
import re
import stat

from ansible_collections.hypeman.vgpu.plugins.module_utils import _fileio, _hypeman
from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError
from ansible_collections.hypeman.vgpu.plugins.module_utils._gotime import (
    format_utc_rfc3339nano, from_unix_ns, parse_rfc3339, to_unix_ns)

MARKER_PREFIX = b"HYPEMAN-GPU-INIT-"
# Every line a marker can be on holds these bytes; the scan looks for them with one
# bytes.find per block (the longer the needle, the longer the skips) and cuts out only
# the lines around a hit.
_NEEDLE = b"[guest-agent] " + MARKER_PREFIX
# hypeman's L1 sentinel reads lines with bufio.Reader.ReadSlice('\n') on a 64 KiB
# buffer: a line counts only when its bytes *including* the "\n" fit in it, so
# its text (CR included) is at most MAX_LINE_BYTES - 1 bytes; longer lines are
# skipped to their newline (docs/hypeman-interface.md §5.2).
MAX_LINE_BYTES = 64 * 1024
BLOCK_BYTES = 1 << 20
FINGERPRINT_BYTES = 4096  # bytes before a cursor that must be unchanged to resume there
STATE_VERSION = 1
STATE_SUBDIR = "sentinel"
# A cursor this collection writes stays far below this (each text it keeps is
# capped); a bigger file is not ours and is refused unread.
CURSOR_LIMIT = 4 * 1024 * 1024
# The largest log read. hypeman copytruncates app.log at logging.max_size (default 50MB)
# every 5 minutes; a log past this is not one it keeps (a sparse or runaway file would
# take hours to read: 16 TiB sparse is about 9 h at 0.5 GB/s).
LOG_LIMIT = 8 * 1024 ** 3
VENDOR_VFIO = "vendor-vfio"
# hypeman's L1 sentinel reads the logs every 5 s and acts on the last marker of each
# pass: a FAILED more than one interval before the OK had a pass of its own.
POLL_NS = 5 * 10 ** 9

# hypeman's newest L1 patterns (docs/hypeman-interface.md §5.2), applied to one line without
# its "\n". Go's \d and \S are ASCII classes; \S is written out because
# Python's also excludes \v, Go's does not.
_PREFIX = rb"[0-9]{4}/[0-9]{2}/[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2} \[guest-agent\] "
_GO_NOT_SPACE = rb"[^\t\n\f\r ]+"
_FAILED_RE = re.compile(
    _PREFIX + rb"HYPEMAN-GPU-INIT-FAILED ts=(" + _GO_NOT_SPACE
    + rb") nvrm=\"(NVRM: [^\"\r\n]*RmInitAdapter failed![^\"\r\n]*)\"\r?")
_OK_RE = re.compile(_PREFIX + rb"HYPEMAN-GPU-INIT-OK ts=(" + _GO_NOT_SPACE + rb")\r?")
_ARCHIVE_RE = re.compile(r"^app\.log\.prev\.([0-9]+)$")
_SAFE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,254}$")


class Marker(object):
    """One marker line: ``verdict`` (failed/ok), ``ts`` and ``nvrm`` as written."""

    __slots__ = ("verdict", "ts", "nvrm", "file")

    def __init__(self, verdict, ts, nvrm, file=None):
        self.verdict = verdict
        self.ts = ts
        self.nvrm = nvrm
        self.file = file

    def key(self):
        """What makes two marker lines the same report (the agent prints 3 copies)."""
        return (self.verdict, self.ts, self.nvrm)

    def __repr__(self):
        return "Marker(%r, %r, %r, %r)" % (self.verdict, self.ts, self.nvrm, self.file)


def _text(raw):
    return bytes(raw).decode("utf-8", "replace")


def match_marker(line):
    """The :class:`Marker` on ``line`` (bytes, without "\\n"), or None.

    Only a complete guest-agent line counts: log prefix, ``[guest-agent]``,
    marker, fields, nothing after (one trailing CR allowed, as in hypeman).
    """
    if len(line) >= MAX_LINE_BYTES or MARKER_PREFIX not in line:
        return None
    match = _FAILED_RE.fullmatch(line)
    if match:
        return Marker("failed", _text(match.group(1)), _text(match.group(2)))
    match = _OK_RE.fullmatch(line)
    if match:
        return Marker("ok", _text(match.group(1)), None)
    return None


class MarkerReader(object):
    """Finds marker lines in a byte stream fed block by block.

    Only the line in progress is carried between blocks, and only while it
    could still fit hypeman's 64 KiB line (MAX_LINE_BYTES including its
    "\\n"): a longer line is skipped up to its newline without being kept, so
    a 10 MB line costs no memory. A final line without its newline is not a
    complete line; it stays ``partial`` until the rest arrives (in a later
    block, file or run).

    Each marker goes to ``sink(marker)`` when given (the scan keeps nothing
    per marker), else to the ``markers`` list; ``count`` counts them.
    """

    def __init__(self, partial=b"", overlong=False, sink=None):
        self.partial = partial
        self.overlong = overlong
        self.markers = []
        self.sink = sink if sink is not None else self.markers.append
        self.count = 0
        self.source = None

    def reset_line(self):
        """Drop the line in progress (the next byte starts a new line)."""
        self.partial = b""
        self.overlong = False

    def _line(self, line):
        marker = match_marker(line)
        if marker is not None:
            marker.file = self.source
            self.count += 1
            self.sink(marker)

    def _extend(self, buf, start, end):
        if self.overlong:
            return
        if len(self.partial) + (end - start) >= MAX_LINE_BYTES:  # its "\n" cannot fit any more
            self.partial = b""
            self.overlong = True
        else:
            self.partial += bytes(buf[start:end])

    def feed(self, buf, size):
        """Consume ``buf[:size]`` (bytes or bytearray).

        The hot path is one ``find`` of the needle per block; only a line
        holding it is cut out and matched, and only the unfinished last line
        is kept for the next block.
        """
        start = 0
        if self.overlong or self.partial:
            # Finish the line that began in an earlier block.
            first_nl = buf.find(b"\n", 0, size)
            if first_nl < 0:
                self._extend(buf, 0, size)
                return
            if not self.overlong and len(self.partial) + first_nl < MAX_LINE_BYTES:
                self._line(self.partial + bytes(buf[:first_nl]))
            self.reset_line()
            start = first_nl + 1
        pos = buf.find(_NEEDLE, start, size)
        while pos >= 0:
            line_end = buf.find(b"\n", pos, size)
            if line_end < 0:
                break  # the line goes on in the next block: carried below
            line_start = buf.rfind(b"\n", start, pos) + 1 or start
            if line_end - line_start < MAX_LINE_BYTES:
                self._line(bytes(buf[line_start:line_end]))
            start = line_end + 1
            pos = buf.find(_NEEDLE, start, size)
        if start < size:
            self._extend(buf, buf.rfind(b"\n", start, size) + 1 or start, size)


# --- files -----------------------------------------------------------------------


class LogError(Exception):
    """A log that exists but cannot be read as a regular file."""


class LogRefused(LogError):
    """A log or log directory refused by policy (a symlink, a shared file): the host is not as hypeman leaves it."""


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def _open_dir_nofollow(name, path, dir_fd=None):
    """An fd of the real directory ``name`` (relative to ``dir_fd``); ``path`` names it in errors."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as err:
        symlink = err.errno == errno.ELOOP
        if err.errno == errno.ENOTDIR:  # O_DIRECTORY wins over O_NOFOLLOW for a symlink: ask which
            try:
                symlink = stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
            except OSError:
                pass
        if symlink:
            raise LogRefused("refused %s: it is a symlink; the sentinel reads only real directories "
                             "inside the instance directory" % path)
        if err.errno == errno.ENOENT:
            raise LogError("%s does not exist (the instance has not booted yet)" % path)
        if err.errno == errno.ENOTDIR:
            raise LogError("cannot read %s: not a directory" % path)
        raise LogError("cannot read %s: %s" % (path, err.strerror or err))


def open_log_dir(log_dir):
    """An fd of ``<guests>/<id>/logs``, refusing a symlinked instance directory or ``logs``.

    Every log is then opened relative to this fd, so a symlink swapped in
    while we read cannot send the scan to another instance's files.
    """
    guest_dir = os.path.dirname(log_dir)
    guest_fd = _open_dir_nofollow(guest_dir, guest_dir)
    try:
        return _open_dir_nofollow(os.path.basename(log_dir), log_dir, dir_fd=guest_fd)
    finally:
        os.close(guest_fd)


def _open_log(dir_fd, log_dir, name):
    """``(fd, stat)`` of the regular file ``name`` in the log dir, or ``(None, None)`` when it does not exist.

    Never follows a symlink, never blocks on a FIFO, refuses a file with
    other hard links (it could be another instance's log) or over :data:`LOG_LIMIT`.
    """
    path = os.path.join(log_dir, name)
    try:
        fd, st = _fileio.open_regular(name, follow=False, dir_fd=dir_fd)
        if st.st_size > LOG_LIMIT:
            os.close(fd)
            raise LogRefused("refused %s: it is %d bytes, more than %d; hypeman rotates app.log at "
                             "logging.max_size (default 50MB), so check its log rotation" % (path, st.st_size, LOG_LIMIT))
    except FileNotFoundError:
        return None, None
    except _fileio.HostFileError as err:
        if err.errno == errno.ELOOP:
            raise LogRefused("refused %s: it is a symlink; the sentinel reads only regular files "
                             "inside the instance's logs directory" % path)
        raise LogError("cannot read %s: it %s" % (path, err.strerror))
    except IsADirectoryError:
        raise LogError("cannot read %s: it is a directory, not a regular file" % path)
    except OSError as err:
        try:  # a socket fails the open itself (ENXIO): say what it is
            mode = os.lstat(name, dir_fd=dir_fd).st_mode
        except OSError:
            mode = stat.S_IFREG
        if not stat.S_ISREG(mode):
            raise LogError("cannot read %s: it is %s, not a regular file" % (path, _fileio.file_kind(mode)))
        raise LogError("cannot read %s: %s" % (path, err.strerror or err))
    if st.st_nlink > 1:
        os.close(fd)
        raise LogRefused("refused %s: it has %d hard links; a log shared with another file is not "
                         "this instance's own" % (path, st.st_nlink))
    return fd, st


def _ident(st):
    """What identifies one version of a file: device, inode, size, mtime."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]


def _pread(fd, size, offset, path):
    try:
        return os.pread(fd, size, offset)
    except OSError as err:
        raise LogError("cannot read %s: %s" % (path, err.strerror or err))


def _fingerprint(data):
    return hashlib.sha256(data).hexdigest()


def _bytes_before(fd, offset, path):
    """The up to FINGERPRINT_BYTES bytes just before ``offset``."""
    size = min(offset, FINGERPRINT_BYTES)
    data = _pread(fd, size, offset - size, path)
    return data if len(data) == size else None


class _Span(object):
    """Reads ``[start, end)`` of one file into a MarkerReader, block by block."""

    def __init__(self, path, fd, start, end, seed=b""):
        self.path = path
        self.fd = fd
        self.start = start
        self.end = end
        self.pos = start
        self.tail = seed  # last FINGERPRINT_BYTES bytes before ``pos``

    def read(self, reader, buf):
        reader.source = self.path
        view = memoryview(buf)
        try:
            os.lseek(self.fd, self.pos, os.SEEK_SET)
            while self.pos < self.end:
                want = min(len(buf), self.end - self.pos)
                size = os.readv(self.fd, [view[:want]])
                if size == 0:
                    break  # truncated while we read: the rest is for the next run
                reader.feed(buf, size)
                self.pos += size
                if size >= FINGERPRINT_BYTES:
                    self.tail = bytes(buf[size - FINGERPRINT_BYTES:size])
                else:
                    self.tail = (self.tail + bytes(buf[:size]))[-FINGERPRINT_BYTES:]
        except OSError as err:
            raise LogError("cannot read %s: %s" % (self.path, err.strerror or err))
        finally:
            view.release()
        return self.pos - self.start


# --- per-instance state ----------------------------------------------------------------


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_text(value):
    """A str that can go out as UTF-8 (JSON may carry lone surrogates, which cannot)."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _valid_ident(value):
    return isinstance(value, list) and len(value) == 4 and all(_is_int(v) for v in value)


def _valid_earlier_failure(value):
    return value is None or (isinstance(value, dict) and all(_is_text(value.get(k)) for k in ("ts", "nvrm", "file")))


def _valid_verdict(value, archive=False):
    if not isinstance(value, dict) or value.get("verdict") not in ("failed", "ok"):
        return False
    if not _is_text(value.get("ts")) or not (value.get("nvrm") is None or _is_text(value.get("nvrm"))):
        return False
    if archive:
        return True
    if not _valid_earlier_failure(value.get("earlier_failure")):  # absent in cursors of older versions
        return False
    return _is_text(value.get("file")) and isinstance(value.get("recorded"), bool)


def _valid_log(value):
    if value is None:
        return True
    if not isinstance(value, dict) or not _valid_ident(value.get("ident")):
        return False
    if not _is_int(value.get("offset")) or not isinstance(value.get("fingerprint"), str):
        return False
    if not isinstance(value.get("partial"), str) or not isinstance(value.get("overlong"), bool):
        return False
    try:
        partial = base64.b64decode(value["partial"].encode("ascii"), validate=True)
    except (ValueError, binascii.Error):
        return False
    return len(partial) <= MAX_LINE_BYTES and b"\n" not in partial


def _valid_assignment(value):
    return isinstance(value, dict) and all(_is_text(value.get(k)) for k in ("vf_address", "assigned_at"))


def valid_state(state, instance_id):
    """True when ``state`` is a cursor record this version wrote for ``instance_id``."""
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        return False
    if state.get("instance_id") != instance_id:
        return False
    if not _valid_assignment(state.get("assignment")):
        return False
    if not _valid_log(state.get("log")):
        return False
    if state.get("rotated") is not None and not _valid_ident(state.get("rotated")):
        return False
    if state.get("verdict") is not None and not _valid_verdict(state.get("verdict")):
        return False
    previous = state.get("previous")
    if previous is not None and not (
            isinstance(previous, dict) and _valid_assignment(previous.get("assignment"))
            and _valid_verdict(previous.get("verdict")) and previous["verdict"]["verdict"] == "ok"):
        return False
    archives = state.get("archives")
    if not isinstance(archives, dict):
        return False
    for name, entry in archives.items():
        if not _ARCHIVE_RE.match(name) or not isinstance(entry, dict):
            return False
        if not _valid_ident(entry.get("ident")) or not _is_int(entry.get("markers")):
            return False
        if entry.get("last") is not None and not _valid_verdict(entry.get("last"), archive=True):
            return False
    return True


class CursorDirError(VgpuError):
    """The cursor directory cannot be used (a symlink, not a directory, unreadable)."""


class CursorStore(object):
    """Per-instance cursor files ``<state_dir>/sentinel/<instance_id>.json``.

    The directory is opened once without following a symlink, and every file
    operation is relative to that descriptor. This class reads them;
    ``_sentinel_write.CursorWriter`` locks the directory and replaces each
    file atomically (fixed temp name ``.<id>.tmp`` under the lock, fsync,
    rename, directory fsync), mode 0600 in a 0700 directory whatever the umask. A
    file that cannot be read, parsed or validated (any kind of file, any
    content) is rebuilt from scratch with a warning, never a crash: the worst
    case is reading logs again, and the store deduplicates per assignment.
    """

    def __init__(self, state_dir):
        self.state_dir = state_dir
        self.directory = os.path.join(state_dir, STATE_SUBDIR)
        self._dir_fd = None
        self._opened = False

    def path(self, instance_id):
        return os.path.join(self.directory, instance_id + ".json")

    def _error(self, err):
        return CursorDirError("cannot use sentinel state directory %s: %s"
                              % (self.directory, getattr(err, "strerror", None) or err), state_dir=self.state_dir)

    def _open_dir(self, create):
        """The directory's fd, or None when it does not exist and ``create`` is false."""
        if self._dir_fd is not None:
            return self._dir_fd
        if self._opened and not create:
            return None  # known not to exist
        created = False
        if create:
            try:
                if not os.path.isdir(self.state_dir):
                    os.makedirs(self.state_dir, 0o700)
                os.mkdir(self.directory, 0o700)
                created = True
            except FileExistsError:
                pass
            except OSError as err:
                raise self._error(err)
        try:
            fd = os.open(self.directory, _DIR_FLAGS)
        except OSError as err:
            if err.errno == errno.ENOENT and not create:
                self._opened = True
                return None
            if err.errno == errno.ELOOP or os.path.islink(self.directory):
                raise CursorDirError("refused sentinel state directory %s: it is a symlink; remove it and "
                                     "run again" % self.directory, state_dir=self.state_dir)
            raise self._error(err)
        if created:
            try:
                os.fchmod(fd, 0o700)  # mkdir's mode is cut by the umask
                _fsync_dir(self.state_dir)  # the new directory entry survives a crash
            except OSError as err:
                os.close(fd)
                raise self._error(err)
        self._dir_fd = fd
        self._opened = True
        return fd

    def close(self):
        """Close the directory (it is opened again when needed)."""
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None
        self._opened = False

    def load(self, instance_id):
        """``(state or None, warning or None)``; raises :class:`LogError` when the cursor cannot be replaced."""
        path = self.path(instance_id)
        dir_fd = self._open_dir(create=False)
        if dir_fd is None:
            return None, None
        try:
            fd, _st = _fileio.open_regular(instance_id + ".json", follow=False, dir_fd=dir_fd)
        except FileNotFoundError:
            return None, None
        except IsADirectoryError:
            # rename() cannot replace a directory: this instance cannot keep a cursor.
            raise LogError("sentinel cursor %s is a directory, not a file; remove it" % path)
        except OSError as err:
            return None, ("sentinel cursor %s is unreadable (%s); rebuilding it from scratch"
                          % (path, err.strerror or err))
        try:
            data = _fileio.read_fd(fd, path, CURSOR_LIMIT)
        except OSError as err:
            return None, ("sentinel cursor %s is unreadable (%s); rebuilding it from scratch"
                          % (path, err.strerror or err))
        finally:
            os.close(fd)
        try:
            state = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
        except (ValueError, RecursionError) as err:
            return None, ("sentinel cursor %s is corrupt (%s); rebuilding it from scratch"
                          % (path, _short(err)))
        if not valid_state(state, instance_id):
            return None, ("sentinel cursor %s is corrupt (unexpected content); rebuilding it from scratch"
                          % path)
        return state, None

    def known_ids(self):
        dir_fd = self._open_dir(create=False)
        if dir_fd is None:
            return []
        try:
            names = os.listdir(dir_fd)
        except OSError:
            return []
        return [n[:-5] for n in names if n.endswith(".json") and not n.startswith(".")]


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _reject_constant(name):
    raise ValueError("invalid JSON value %s" % name)


def _short(err):
    text = str(err)
    return text if len(text) <= 200 else text[:200] + "..."


# --- scanning one instance ------------------------------------------------------------------


def _encode_partial(data):
    return base64.b64encode(data).decode("ascii")


def _decode_partial(text):
    return base64.b64decode(text.encode("ascii"))


MAX_UNATTRIBUTED = 100  # per instance and run; the rest is counted in a warning
MAX_HISTORY_TEXT = 512  # characters of ts/nvrm kept per archive summary (a cursor stays small)


class _Evidence(object):
    """Attributes each marker of one instance's scan as it is read: constant memory.

    A marker counts for the assignment when host facts do not rule its file
    out (``stale``) and its ``ts`` is not before the assignment; the last one
    wins. The others are listed as unattributed (copies once, at most
    MAX_UNATTRIBUTED).

    ``earlier_failure`` is the first FAILED of the failures just before an OK
    when its ``ts`` is more than POLL_NS before that OK's: hypeman read it on a
    pass of its own and reported it before the success. ``unrecorded`` is the
    verdict an earlier run of the same assignment left unrecorded: the bytes
    it came from are not read again, so it stands for them.
    """

    def __init__(self, instance_id, assignment, stale, unrecorded=None):
        self.instance_id = instance_id
        self.assignment = assignment
        self.stale = stale
        self.last = None
        self.count = 0
        self.unattributed = []
        self.more = 0
        self._listed = set()
        self.earlier_failure = None
        self._first_failed = None  # (ts, nvrm, file) of the first FAILED since the last OK
        if unrecorded is not None:
            if unrecorded["verdict"] == "failed":
                self._first_failed = (unrecorded["ts"], unrecorded["nvrm"], unrecorded["file"])
            elif unrecorded.get("earlier_failure"):
                self.earlier_failure = dict(unrecorded["earlier_failure"])

    def _attribute(self, marker):
        self.last = marker
        if marker.verdict == "failed":
            if self._first_failed is None:
                self._first_failed = (marker.ts, marker.nvrm, marker.file)
            return
        if self._first_failed is not None and _apart(self._first_failed[0], marker.ts):
            self.earlier_failure = dict(zip(("ts", "nvrm", "file"), self._first_failed))
        self._first_failed = None

    def __call__(self, marker):
        self.count += 1
        # Host facts first: a file last written before the assignment holds nothing of it,
        # whatever its guest timestamps say. The guest ts can then only exclude.
        why = self.stale.get(marker.file)
        if why is None and self.assignment["time"] is None:
            self._attribute(marker)  # no assignment time: nothing to compare ts with (as in hypeman)
            return
        if why is None:
            try:
                when = parse_rfc3339(marker.ts)
            except ValueError:
                why = "marker ts is not an RFC 3339 time"
            else:
                if when >= self.assignment["time"]:
                    self._attribute(marker)
                    return
                why = "marker ts is earlier than the assignment time %s" % self.assignment["assigned_at"]
        ident = (marker.key(), marker.file)
        if ident in self._listed:  # three copies, one entry
            return
        if len(self.unattributed) >= MAX_UNATTRIBUTED:
            self.more += 1
            return
        self._listed.add(ident)
        self.unattributed.append({
            "instance_id": self.instance_id, "file": marker.file, "verdict": marker.verdict,
            "ts": marker.ts, "nvrm": marker.nvrm, "reason": why})


def _apart(failed_ts, ok_ts):
    """Whether the OK's ts is more than one sentinel pass after the FAILED's (False if either is no time)."""
    try:
        return to_unix_ns(parse_rfc3339(ok_ts)) - to_unix_ns(parse_rfc3339(failed_ts)) > POLL_NS
    except ValueError:
        return False


class _ArchiveSummary(object):
    """Distinct reports and the last marker of one archive, in constant memory."""

    def __init__(self):
        self.reports = 0
        self.last = None

    def __call__(self, marker):
        if self.last is None or self.last.key() != marker.key():  # the agent's copies are back to back
            self.reports += 1
        self.last = marker

    def entry(self, ident):
        last = self.last
        return {"ident": ident, "markers": self.reports,
                "last": None if last is None else {"verdict": last.verdict, "ts": last.ts[:MAX_HISTORY_TEXT],
                                                   "nvrm": None if last.nvrm is None else last.nvrm[:MAX_HISTORY_TEXT]}}


def _archive_ns(name):
    return int(_ARCHIVE_RE.match(name).group(1))


class _InstanceScan(object):
    """Scan one instance's logs, starting from its previous cursor record.

    Which bytes may hold evidence for the current assignment is decided from
    host-side facts only (the guest's clock is not trusted; see
    docs/sentinel.md, "Which bytes belong to an assignment"):

    * a log file whose mtime (host clock) is before the assignment time, or
      before the current boot began (the newest ``app.log.prev.<ns>``, named
      by hypeman with the host clock), was last written before the
      assignment: its markers are listed in ``stale`` and never attributed;
    * a new ``app.log.prev.<ns>`` since the last scan means a new boot: the
      cursor's ``app.log`` stream is over, whatever its inode;
    * bytes read under a previous assignment of the same ``app.log`` stream
      stay with that assignment: a new assignment resumes after them.
    """

    def __init__(self, instance_id, log_dir, old, buf, assignment):
        self.instance_id = instance_id
        self.log_dir = log_dir
        self.old = old or {}
        self.buf = buf
        self.scanned = []
        self.warnings = []
        self.app_path = os.path.join(log_dir, "app.log")
        self.rotated_path = self.app_path + ".1"
        self.floor_ns = to_unix_ns(assignment["time"]) if assignment["time"] is not None else 0
        self.floor_why = "the assignment (%s)" % assignment["assigned_at"]
        self.archive_names = []
        self.new_boot = False
        self.stale = {}  # path -> why none of its markers belong to the assignment
        self.dir_fd = None

    def close(self):
        if self.dir_fd is not None:
            os.close(self.dir_fd)
            self.dir_fd = None

    def _list(self):
        self.dir_fd = open_log_dir(self.log_dir)
        try:
            names = os.listdir(self.dir_fd)
        except OSError as err:
            raise LogError("cannot list %s: %s" % (self.log_dir, err.strerror or err))
        self.archive_names = sorted((n for n in names if _ARCHIVE_RE.match(n)), key=_archive_ns)
        if self.archive_names:
            newest = self.archive_names[-1]
            if _archive_ns(newest) > self.floor_ns:
                self.floor_ns = _archive_ns(newest)
                self.floor_why = "the current boot began (%s)" % newest
        known = self.old.get("archives")
        self.new_boot = known is not None and any(n not in known for n in self.archive_names)

    def _check_written_during(self, path, st):
        """Mark ``path`` stale when the host says it was last written before the assignment."""
        if st is not None and st.st_mtime_ns < self.floor_ns:
            self.stale[path] = "%s was last written at %s (host clock), before %s" % (
                os.path.basename(path), format_utc_rfc3339nano(from_unix_ns(st.st_mtime_ns)), self.floor_why)

    def _read(self, reader, spans):
        for span in spans:
            before = reader.count
            count = span.read(reader, self.buf)
            self.scanned.append({"instance_id": self.instance_id, "file": span.path, "bytes_read": count,
                                 "markers": reader.count - before})

    def current(self, same_assignment, sink):
        """Read new bytes of the current log stream into ``sink``; returns (log, rotated)."""
        self._list()
        app_fd, app_st = _open_log(self.dir_fd, self.log_dir, "app.log")
        rot_fd = None
        try:
            rot_fd, rot_st = _open_log(self.dir_fd, self.log_dir, "app.log.1")
            if app_fd is None:
                raise LogError("%s does not exist (the instance has not booted yet)" % self.app_path)
            self._check_written_during(self.app_path, app_st)
            self._check_written_during(self.rotated_path, rot_st)
            old_log = self.old.get("log")
            rot_ident = _ident(rot_st) if rot_st is not None else None
            # app.log.1 is written only by a rotation: a new one means app.log was cut since last time.
            rot_new = rot_ident is not None and rot_ident != self.old.get("rotated")
            reader = MarkerReader(sink=sink)
            # The same app.log stream as at the last scan: same file, no boot since.
            resumable = (old_log is not None and not self.new_boot
                         and old_log["ident"][:2] == [app_st.st_dev, app_st.st_ino])
            if resumable:
                app_span = self._resume(reader, old_log, app_fd, app_st, rot_fd, rot_st, rot_new, same_assignment)
            else:
                # A new file (new boot) or no cursor: start fresh. hypeman's sentinel reads
                # app.log.1 only to finish a stream it was following when app.log was
                # copytruncated, so it has read an app.log.1 only when that was this boot's
                # app.log, rotated during this assignment (the host clock decides, as
                # above); any other app.log.1 (a previous boot's) is not read at all.
                # Read, it is one stream with app.log, as in _resume: a line the
                # rotation cut is joined, so losing the cursor changes no verdict.
                spans = []
                if rot_new and self.rotated_path not in self.stale:
                    spans.append(_Span(self.rotated_path, rot_fd, 0, rot_st.st_size))
                self._read(reader, spans)
                app_span = _Span(self.app_path, app_fd, 0, app_st.st_size)
                self._read(reader, [app_span])
            log = {
                "ident": _ident(app_st),
                "offset": app_span.pos,
                "fingerprint": _fingerprint(app_span.tail),
                "partial": _encode_partial(reader.partial),
                "overlong": reader.overlong,
            }
            return log, rot_ident
        finally:
            for fd in (app_fd, rot_fd):
                if fd is not None:
                    os.close(fd)

    def _resume(self, reader, old_log, app_fd, app_st, rot_fd, rot_st, rot_new, same_assignment):
        offset = old_log["offset"]
        seed = _bytes_before(app_fd, offset, self.app_path) if app_st.st_size >= offset else None
        intact = seed is not None and _fingerprint(seed) == old_log["fingerprint"]
        partial = _decode_partial(old_log["partial"])
        overlong = old_log["overlong"]
        if not same_assignment:
            # The bytes before the cursor were read under the previous assignment and stay
            # with it; so does the rest of a line already begun then (skipped to its end).
            partial, overlong = b"", bool(partial) or overlong
        if intact and not rot_new:
            reader.partial, reader.overlong = partial, overlong
            app_span = _Span(self.app_path, app_fd, offset, app_st.st_size, seed)
            self._read(reader, [app_span])
            return app_span
        # copytruncate happened: the unread tail of the old stream is in app.log.1.
        rot_seed = None
        if rot_new and rot_st.st_size >= offset:
            rot_seed = _bytes_before(rot_fd, offset, self.rotated_path)
        if rot_seed is not None and _fingerprint(rot_seed) == old_log["fingerprint"]:
            # One stream: a line cut by the rotation is joined and matched once.
            reader.partial, reader.overlong = partial, overlong
            self._read(reader, [_Span(self.rotated_path, rot_fd, offset, rot_st.st_size, rot_seed)])
        else:
            self.warnings.append(
                "%s was truncated or rotated more than once since the last scan of instance %s; "
                "markers written in between may have been missed" % (self.app_path, self.instance_id))
            if rot_new:
                self._read(reader, [_Span(self.rotated_path, rot_fd, 0, rot_st.st_size)])
            reader.reset_line()
        app_span = _Span(self.app_path, app_fd, 0, app_st.st_size)
        self._read(reader, [app_span])
        return app_span

    def archives(self):
        """Summaries of ``app.log.prev.<ns>`` archives (earlier boots), read once each."""
        old = self.old.get("archives") or {}
        result = {}
        for name in self.archive_names:
            path = os.path.join(self.log_dir, name)
            fd, st = _open_log(self.dir_fd, self.log_dir, name)
            if fd is None:
                continue  # pruned while we looked
            try:
                previous = old.get(name)
                if previous is not None and previous["ident"] == _ident(st):
                    result[name] = previous  # archives never change: read each one once
                    continue
                summary = _ArchiveSummary()
                self._read(MarkerReader(sink=summary), [_Span(path, fd, 0, st.st_size)])
                result[name] = summary.entry(_ident(st))
            finally:
                os.close(fd)
        return result


# --- the scan ------------------------------------------------------------------------------


def _assignment_of(instance):
    """``(assignment, None)`` for a scannable instance, else ``(None, reason)``."""
    directory = instance.get("dir")
    if directory and os.path.basename(directory) != instance["id"]:
        return None, "metadata Id does not match its directory %s" % directory
    if instance.get("retained_for_cleanup"):
        return None, "retention stub (GPURetainedForCleanup): hypeman's sentinel skips it"
    if instance.get("framework") != VENDOR_VFIO or not instance.get("device_path"):
        return None, "no vendor-VFIO vGPU claim"
    if not instance.get("vf_address"):
        return None, "vGPU claim has no VF address (GPUDevicePath %r)" % instance.get("device_path")
    if not instance.get("assigned_at"):
        # hypeman's sentinel scans such an instance too and reports for assigned_at ""
        # (GPUAssignedAt nil): only host facts (the boot) bound its evidence then.
        return {"vf_address": instance["vf_address"], "assigned_at": "", "time": None}, None
    try:
        assigned = parse_rfc3339(instance["assigned_at"])
    except ValueError as err:
        return None, "vGPU assignment time is not an RFC 3339 time: %s" % err
    return {"vf_address": instance["vf_address"], "assigned_at": instance["assigned_at"],
            "time": assigned}, None


class ScanReport(object):
    """What one scan found; :meth:`commit` persists the cursors (not in check mode)."""

    def __init__(self):
        self.findings = []
        self.history = []
        self.scanned = []
        self.skipped = []
        self.unattributed = []
        self.warnings = []
        self._states = {}  # instance_id -> (new state, changed)
        self._prune = []
        self._cursors = None

    def unrecorded(self):
        """Findings whose verdict is not yet in the store."""
        return [f for f in self.findings if not f["recorded"]]

    def mark_recorded(self, findings):
        """After the store took these reports, remember it in the cursors."""
        for finding in findings:
            state = self._states[finding["instance_id"]][0]
            held = state["verdict"] if finding["current"] else state["previous"]["verdict"]
            held["recorded"] = True
            finding["recorded"] = True
            self._states[finding["instance_id"]] = (state, True)

    def commit(self):
        """Write every changed cursor and drop those of vanished instances."""
        if self._cursors is None:
            return
        changed = [(instance_id, state) for instance_id, (state, changed) in sorted(self._states.items()) if changed]
        touched = bool(changed)
        if changed:
            self._cursors.save_all(changed)
        for instance_id in self._prune:
            self._cursors.remove(instance_id)
            touched = True
        if touched:
            self._cursors.sync()


def scan(instances, unreadable, log_dir_of, state_dir, only=None, check_mode=False,
         block_size=BLOCK_BYTES, cursors=None):
    """Scan the instances' logs; returns a :class:`ScanReport`.

    ``instances`` and ``unreadable`` are what ``_hypeman.list_instances``
    returns; ``log_dir_of(instance_id)`` gives an instance's ``logs`` dir;
    ``only`` restricts the scan to these instance ids. Cursor files are read
    here and written by ``ScanReport.commit`` (never in check mode); when not
    in check mode the caller passes ``cursors``, a ``_sentinel_write.CursorWriter``
    it holds locked around both (``_sentinel_write.run`` does).
    """
    if not check_mode and cursors is None:
        raise ValueError("a scan that writes cursors needs the locked cursors of _sentinel_write.run")
    report = ScanReport()
    own = cursors is None
    if own:
        cursors = CursorStore(state_dir)
    if not check_mode:
        report._cursors = cursors
    try:
        _scan_all(report, cursors, instances, unreadable, log_dir_of, only, check_mode, block_size)
    finally:
        if own:
            cursors.close()
    return report


def _scan_all(report, cursors, instances, unreadable, log_dir_of, only, check_mode, block_size):
    wanted = set(only) if only is not None else None
    listed = set()
    for entry in unreadable:
        instance_id = entry.get("instance_id")
        listed.add(instance_id)
        if wanted is None or instance_id in wanted:
            report.skipped.append({"instance_id": instance_id,
                                   "reason": "metadata unreadable: %s" % entry.get("error")})
    buf = bytearray(block_size)
    for instance in sorted(instances, key=lambda i: i["id"]):
        instance_id = instance["id"]
        listed.add(instance_id)
        if instance.get("dir"):
            listed.add(os.path.basename(instance["dir"]))  # keep its cursor even when Id disagrees
        if wanted is not None and instance_id not in wanted:
            continue
        _scan_one(report, cursors, instance, log_dir_of, buf)
    if wanted is not None:
        for instance_id in sorted(wanted - listed):
            report.skipped.append({"instance_id": instance_id, "reason": "no such instance"})
    elif not check_mode:
        report._prune = sorted(i for i in set(cursors.known_ids()) - listed)


def _scan_one(report, cursors, instance, log_dir_of, buf):
    instance_id = instance["id"]
    if not isinstance(instance_id, str) or not _SAFE_ID_RE.match(instance_id):
        report.skipped.append({"instance_id": instance_id, "reason": "instance id is not a safe path component"})
        return
    assignment, reason = _assignment_of(instance)
    if assignment is None:
        report.skipped.append({"instance_id": instance_id, "reason": reason})
        return
    try:
        old, warning = cursors.load(instance_id)
    except LogError as err:
        report.skipped.append({"instance_id": instance_id, "reason": str(err)})
        return
    if warning:
        report.warnings.append(warning)
    key = {"vf_address": assignment["vf_address"], "assigned_at": assignment["assigned_at"]}
    same_assignment = old is not None and old["assignment"] == key
    log_dir = log_dir_of(instance_id)
    work = _InstanceScan(instance_id, log_dir, old, buf, assignment)
    held = old.get("verdict") if same_assignment else None
    evidence = _Evidence(instance_id, assignment, work.stale,
                         unrecorded=held if held is not None and not held["recorded"] else None)
    try:
        log, rotated = work.current(same_assignment, evidence)
        archives = work.archives()
    except LogError as err:
        report.skipped.append({"instance_id": instance_id, "reason": str(err)})
        if isinstance(err, LogRefused):
            report.warnings.append("sentinel skipped instance %s: %s" % (instance_id, err))
        return
    finally:
        work.close()
    report.scanned.extend(work.scanned)
    report.warnings.extend(work.warnings)

    verdict = dict(old["verdict"]) if same_assignment and old.get("verdict") else None
    previous = _pending_previous(old, same_assignment)
    last = evidence.last
    report.unattributed.extend(evidence.unattributed)
    if evidence.more:
        report.warnings.append("instance %s: %d more unattributed markers read in this run are not listed"
                               % (instance_id, evidence.more))
    if evidence.count and not _still_assigned(instance, key):
        # hypeman re-checks the assignment before acting: a restart or release during
        # the scan means these bytes may belong to another assignment, and a cursor
        # saved now would hand them to this one. Try next run.
        report.skipped.append({"instance_id": instance_id,
                               "reason": "vGPU assignment changed during the scan; scan again"})
        return
    if last is not None:
        same_report = verdict is not None and (verdict["verdict"], verdict["ts"], verdict["nvrm"]) == last.key()
        if not same_report:
            verdict = {"verdict": last.verdict, "ts": last.ts, "nvrm": last.nvrm,
                       "file": last.file, "recorded": False,
                       "earlier_failure": evidence.earlier_failure if last.verdict == "ok" else None}
    state = {
        "version": STATE_VERSION,
        "instance_id": instance_id,
        "assignment": key,
        "log": log,
        "rotated": rotated,
        "verdict": verdict,
        "archives": archives,
    }
    if previous is not None:
        state["previous"] = previous
    report._states[instance_id] = (state, state != old)
    if previous is not None:
        report.findings.append(_finding(instance_id, previous["assignment"], previous["verdict"], current=False))
    if verdict is not None:
        report.findings.append(_finding(instance_id, key, verdict, current=True))
    for name, entry in sorted(archives.items(), key=lambda kv: _archive_ns(kv[0])):
        if entry["last"] is not None:
            report.history.append(dict(entry["last"], instance_id=instance_id,
                                       file=os.path.join(log_dir, name), markers=entry["markers"]))


def _finding(instance_id, assignment, verdict, current):
    return {
        "instance_id": instance_id,
        "vf_address": assignment["vf_address"],
        "assigned_at": assignment["assigned_at"],
        "current": current,
        "verdict": verdict["verdict"],
        "ts": verdict["ts"],
        "nvrm": verdict["nvrm"],
        "file": verdict["file"],
        "recorded": verdict["recorded"],
        "earlier_failure": verdict.get("earlier_failure"),
    }


def _pending_previous(old, same_assignment):
    """The previous assignment's OK verdict still to be reported, or None.

    hypeman's L1 sentinel retries a success report that failed to persist
    once more for the old assignment before it replaces the instance's tail
    (the follow-up of kernel/hypeman PR #435's review). Here an OK that no
    run recorded yet is that pending success: it is kept, and reported for
    the old (VF, assigned_at), until a ``record`` run stores it. A FAILED
    verdict is not carried over: hypeman never reports a failure after the
    assignment changed.
    """
    if old is None:
        return None
    if same_assignment:
        previous = old.get("previous")
        if previous is None or previous["verdict"]["recorded"]:
            return None  # stored by an earlier run: done
        return {"assignment": dict(previous["assignment"]), "verdict": dict(previous["verdict"])}
    verdict = old.get("verdict")
    if verdict is not None and verdict["verdict"] == "ok" and not verdict["recorded"]:
        return {"assignment": dict(old["assignment"]), "verdict": dict(verdict)}
    return None


def _still_assigned(instance, key):
    """Whether the markers read may still go to the assignment ``key``.

    As hypeman's confirmAssignment: only another assignment now in the
    metadata rejects them. A released claim (the metadata is gone or names no
    vendor-VFIO claim any more) leaves them with the assignment they were read
    under; metadata that cannot be read rejects them (hypeman: an error).
    """
    path = instance["metadata_path"]
    try:
        meta = _hypeman.parse_metadata(_fileio.read_bytes(path).decode("utf-8", "replace"))
    except FileNotFoundError:
        return True  # the instance is gone: released
    except (OSError, ValueError, RecursionError):
        return False
    fresh = _hypeman.instance_from_metadata(meta, path)
    if fresh.get("retained_for_cleanup") or fresh.get("framework") != VENDOR_VFIO or not fresh.get("device_path"):
        return True  # released: no longer a sentinel target
    return {"vf_address": fresh.get("vf_address"), "assigned_at": fresh.get("assigned_at") or ""} == key


# --- recording ---------------------------------------------------------------------------------


def _report_order(report):
    instance_id = report[2]["instance_id"]
    try:
        when = parse_rfc3339(report[1])
        return (0, when.sec, when.nsec, instance_id)
    except ValueError:
        return (1, 0, 0, instance_id)


def _reports(findings):
    """(verdict, ts, finding) of each report: an OK's earlier failure goes first."""
    for finding in findings:
        earlier = finding.get("earlier_failure")
        if finding["verdict"] == "ok" and earlier:
            yield "failed", earlier["ts"], finding
        yield finding["verdict"], finding["ts"], finding


def record_verdicts(store, findings, threshold):
    """Report each verdict to the store as hypeman's sentinel would; returns outcomes.

    Reports go in marker-time order (as hypeman would have received them):
    ``failed`` is a failure report for the assignment, ``ok`` a success
    report, preceded by a failure report when the OK has an
    ``earlier_failure``. The store deduplicates per (instance_id,
    assigned_at), so a verdict reported twice never counts twice.
    """
    outcomes = []
    for report in sorted(_reports(findings), key=_report_order):
        verdict, finding = report[0], report[2]
        item = {"instance_id": finding["instance_id"], "vf_address": finding["vf_address"],
                "assigned_at": finding["assigned_at"], "verdict": verdict}
        if verdict == "failed":
            item["report"] = "failure"
            item["outcome"] = store.report_failure(
                finding["vf_address"], finding["instance_id"], finding["assigned_at"], threshold)
            item["cleared"] = 0
        else:
            item["report"] = "success"
            item["outcome"], item["cleared"] = store.report_success(
                finding["vf_address"], finding["instance_id"], finding["assigned_at"])
        outcomes.append(item)
    return outcomes
