# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Load this collection's helpers from a module's AnsiballZ payload: compiled once, then kept as bytecode.

Ansible ships a module and its helpers to the managed host as source files in
a zip file, and Python imports them with ``zipimport``, which keeps no
bytecode and compiles the source of every module it loads twice (Python 3.11
and 3.12: finding the module asks ``get_filename``, which compiles; loading
compiles again). For a plain audit that was about 90 ms of CPU per host and
run, more than the rest of what the module process adds to a ``ping``'s
(docs/performance.md, "Audit cost per host").

A module imports this helper first. When this file was itself loaded from a
zip file (a payload), it puts a finder ahead of the standard ones that serves
only this package's own modules: it reads a helper's source from the same zip
file and loads the code compiled from exactly that source, as Python's own
``__pycache__`` does for plain files: from the bytecode cache when the cache
holds it (keyed by the source's SHA-256 and the interpreter's bytecode version
and optimisation level), else compiled once and written there. The code runs
under the file name zipimport would give it, so tracebacks read the same.
Anywhere else (the controller, unit tests, an unpacked payload) it installs
nothing. A name it does not serve (anything outside this package, a package,
a helper the zip file lacks) is left to the standard import system.

The cache (docs/performance.md, "Bytecode cache on the hosts") is
``~/.cache/hypeman-vgpu/bytecode`` of the user the module runs as (the home
directory from the password database, not ``$HOME``, which ``sudo`` may keep),
or the directory ``$HYPEMAN_VGPU_BYTECODE_CACHE`` names; ``off`` there turns it
off. It is used only as a real directory of that user that no one else can
write, and an entry only as a regular file of that user that no one else can
write, both opened without following symlinks, so no other user can hand a
module code to run. An entry that does not load as code is compiled again and
replaced (written whole, then renamed). With ``PYTHONDONTWRITEBYTECODE`` set
it reads but never writes, as Python does. A new entry replaces the ones of
the same helper and interpreter kept for other sources (another collection
version), so the cache holds one entry per helper and interpreter. Any
failure of the cache falls back to compiling; the cache never fails a module.
"""

from __future__ import annotations

import hashlib
import importlib.util
import marshal
import os
import stat
import sys
import types
import zipimport
from importlib.machinery import ModuleSpec

_PACKAGE = __name__.rpartition(".")[0]

CACHE_ENV = "HYPEMAN_VGPU_BYTECODE_CACHE"
CACHE_OFF = "off"
# Far above the largest helper's code (about 120 KB); a larger entry is not ours.
ENTRY_MAX_BYTES = 16 * 1024 * 1024
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
# A partial file of this suffix belongs to a writer that is still running or was killed.
_PARTIAL = ".partial"


def default_cache_dir():
    """The cache directory to use: ``$HYPEMAN_VGPU_BYTECODE_CACHE`` if set (None for ``off``), else the user's."""
    configured = os.environ.get(CACHE_ENV)
    if configured is not None:
        if configured == CACHE_OFF or not os.path.isabs(configured):
            return None
        return configured
    if sys.implementation.cache_tag is None:
        return None  # this interpreter keeps no bytecode
    try:
        import pwd  # pylint: disable=import-outside-toplevel  # POSIX only, and only here
        home = pwd.getpwuid(os.geteuid()).pw_dir
    except (ImportError, KeyError, OSError):
        return None
    if not home or not os.path.isabs(home):
        return None
    return os.path.join(home, ".cache", "hypeman-vgpu", "bytecode")


def _owned_private(st):
    """True for a file or directory of this process's user that no one else can write."""
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


class BytecodeCache:
    """Code objects compiled from a source, kept in a private directory between processes."""

    def __init__(self, directory, write=None):
        self.directory = directory
        # Python's own rule for __pycache__: PYTHONDONTWRITEBYTECODE reads, never writes.
        self.write = not sys.dont_write_bytecode if write is None else write
        self._dir_fd = None
        self._opened = False

    def _fd(self):
        """The cache directory, opened once (made if missing) and checked; None when it may not be used."""
        if self._opened:
            return self._dir_fd
        self._opened = True
        if not self.directory:
            return None
        try:
            if self.write:
                os.makedirs(self.directory, 0o700, exist_ok=True)
            fd = os.open(self.directory, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC)
        except (OSError, ValueError):
            return None
        try:
            st = os.fstat(fd)
        except OSError:
            os.close(fd)
            return None
        # Another user's directory (or one others can write) could hand this process code it did not compile.
        if not stat.S_ISDIR(st.st_mode) or not _owned_private(st):
            os.close(fd)
            return None
        self._dir_fd = fd
        return fd

    @staticmethod
    def entry_name(stem, source):
        """``stem.<cache tag>-opt<level>.<sha256 of bytecode version, level and source>``."""
        optimize = sys.flags.optimize
        digest = hashlib.sha256(importlib.util.MAGIC_NUMBER + bytes([optimize]) + bytes(source)).hexdigest()
        return "%s.%s-opt%d.%s" % (stem, sys.implementation.cache_tag, optimize, digest)

    def load(self, name, filename):
        """The code kept under ``name``, renamed to ``filename``; None if absent or unusable."""
        dir_fd = self._fd()
        if dir_fd is None:
            return None
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW | _CLOEXEC, dir_fd=dir_fd)
        except (OSError, ValueError):
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or not _owned_private(st) or st.st_size > ENTRY_MAX_BYTES:
                return None
            with os.fdopen(os.dup(fd), "rb") as handle:
                data = handle.read(ENTRY_MAX_BYTES + 1)
            code = marshal.loads(data)
        except (OSError, EOFError, ValueError, TypeError):
            return None
        finally:
            os.close(fd)
        if not isinstance(code, types.CodeType):
            return None
        import _imp  # pylint: disable=import-outside-toplevel
        # The payload's name differs on every run: what Python does for a .pyc that moved.
        _imp._fix_co_filename(code, filename)  # pylint: disable=protected-access
        return code

    def store(self, name, code):
        """Keep ``code`` under ``name`` (whole or not at all) and drop this helper's entries for other sources."""
        dir_fd = self._fd()
        if dir_fd is None or not self.write:
            return
        partial = "%s.%d%s" % (name, os.getpid(), _PARTIAL)
        try:
            data = marshal.dumps(code)
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW | _CLOEXEC, 0o600, dir_fd=dir_fd)
            try:
                with os.fdopen(os.dup(fd), "wb") as handle:
                    handle.write(data)
            finally:
                os.close(fd)
            os.replace(partial, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except (OSError, ValueError):
            try:
                os.unlink(partial, dir_fd=dir_fd)
            except OSError:
                pass
            return
        prefix = name.rpartition(".")[0] + "."
        try:
            others = [entry for entry in os.listdir(dir_fd) if entry.startswith(prefix) and entry != name]
        except OSError:
            return
        for entry in others:
            # Another version's entry, or a writer's partial file: at worst a concurrent writer compiles again.
            try:
                os.unlink(entry, dir_fd=dir_fd)
            except OSError:
                pass

    def code(self, stem, source, filename, compile_source):
        """``source``'s code under ``filename``: from the cache, else ``compile_source(filename, source)`` (kept)."""
        name = self.entry_name(stem, source)
        code = self.load(name, filename)
        if code is None:
            code = compile_source(filename, source)
            self.store(name, code)
        return code


def compile_helper(filename, source):
    """What zipimport does with a module's source."""
    return compile(source, filename, "exec", dont_inherit=True)


class SourceOnceLoader:
    """Loads one helper from the payload's source: cached bytecode, or compiled once."""

    def __init__(self, filename, source, cache=None):
        self.filename = filename
        self.source = source
        self.cache = cache

    def create_module(self, spec):  # pylint: disable=unused-argument
        return None  # the default module object

    def exec_module(self, module):
        if self.cache is None:
            code = compile_helper(self.filename, self.source)
        else:
            code = self.cache.code(module.__name__.rpartition(".")[2], self.source, self.filename, compile_helper)
        exec(code, module.__dict__)  # pylint: disable=exec-used  # what every import system does with a module's code

    def is_package(self, fullname):  # pylint: disable=unused-argument
        return False

    def get_filename(self, fullname):  # pylint: disable=unused-argument
        return self.filename

    def get_source(self, fullname):  # pylint: disable=unused-argument
        # For tracebacks (linecache asks the module's loader).
        return importlib.util.decode_source(self.source)


class PayloadHelperFinder:
    """Finds this package's helpers in the zip file the package came from."""

    def __init__(self, cache=None):
        self.cache = cache

    def find_spec(self, fullname, path=None, target=None):  # pylint: disable=unused-argument
        package, _dot, name = fullname.rpartition(".")
        if package != _PACKAGE or not path:
            return None
        for entry in path:
            try:
                importer = zipimport.zipimporter(entry)
                if importer.is_package(fullname):
                    return None
                filename = os.path.join(importer.archive, importer.prefix, name + ".py")
                source = importer.get_data(filename)
            except (zipimport.ZipImportError, OSError):
                continue
            spec = ModuleSpec(fullname, SourceOnceLoader(filename, source, self.cache), origin=filename)
            spec.has_location = True
            return spec
        return None


def install():
    """Put the finder first on ``sys.meta_path``, once; only inside a payload (see the module docstring)."""
    if not isinstance(getattr(__spec__, "loader", None), zipimport.zipimporter):
        return False
    if not any(isinstance(finder, PayloadHelperFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, PayloadHelperFinder(BytecodeCache(default_cache_dir())))
    return True


install()
