# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Test harness: zipimport compiles each module source once per test phase, not twice per import.

Every module Ansible runs arrives as an AnsiballZ payload, a zip file Python
imports from with ``zipimport``, which caches no bytecode and, on Python 3.11
and 3.12, compiles a module's source twice: finding it asks ``get_filename``,
which compiles to learn the file name, and loading it compiles again
(``get_code``). For a ``ping`` that is about half of the module process's CPU
(docs/testing.md, "Modules compiled once").

This patch keeps the code object ``get_filename`` compiled and hands that same
object to the ``get_code`` that follows. Every payload of a phase also carries
the same ``module_utils`` sources, so it keeps each source's compiled code in
``CODE_CACHE``, keyed by the source's hash and the interpreter's bytecode
version, as Python's own ``__pycache__`` does for plain files: a later
process loads it and gives it its own file name (``_imp._fix_co_filename``,
what Python does when a ``.pyc`` moved). Nothing else changes: the same
source, compiled by the same function, runs exactly as before, under the file
name zipimport gives it. The collection's own ``_payload_loader`` compiles
its helpers once per run on managed hosts; Ansible's own ``module_utils`` are
imported before any module code runs, so only the interpreter can help them.

Loaded at interpreter start by a ``.pth`` file that ``scripts/bootstrap.sh``
puts in the test venvs, and only where ``MARKER`` exists: ``scripts/test.sh``
creates it in the private ``/tmp`` of its integration phases, so benchmarks
and every other use of those venvs run the interpreter unchanged. The
simulated host's image (test equipment) loads it always. The ``.pth`` runs
this file as ``PTH_NAME``, which installs the patch.
"""

from __future__ import annotations

import os
import stat
import sys
import zipimport

MARKER = "/tmp/.hypeman-vgpu-zipimport-compile-once"
CODE_CACHE = "/tmp/.hypeman-vgpu-zipimport-code"
PTH_NAME = "hypeman_vgpu_zipimport_compile_once"


def _private_dir(path):
    """``path`` as a directory only this user can write (made if missing), else None."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        st = os.lstat(path)
    except OSError:
        return None
    # Another user's directory (or one others can write) could hand this process code it did not compile.
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return None
    return path


def cached_compile(compile_source, cache_dir):
    """``zipimport._compile_source`` that keeps each source's code in ``cache_dir``."""

    def compile_cached(pathname, source):
        import _imp  # pylint: disable=import-outside-toplevel  # loaded only by a process that imports from a zip
        import hashlib  # pylint: disable=import-outside-toplevel
        import marshal  # pylint: disable=import-outside-toplevel
        import types  # pylint: disable=import-outside-toplevel
        from importlib.util import MAGIC_NUMBER  # pylint: disable=import-outside-toplevel

        directory = _private_dir(cache_dir)
        if directory is None:
            return compile_source(pathname, source)
        key = hashlib.sha256(MAGIC_NUMBER + bytes([sys.flags.optimize]) + bytes(source)).hexdigest()
        entry = os.path.join(directory, key)
        try:
            with open(entry, "rb") as handle:
                code = marshal.loads(handle.read())
            if isinstance(code, types.CodeType):
                _imp._fix_co_filename(code, pathname)  # pylint: disable=protected-access
                return code
        except (OSError, EOFError, ValueError, TypeError):
            pass  # not there yet, or unreadable: compile it
        code = compile_source(pathname, source)
        partial = "%s.%d.tmp" % (entry, os.getpid())
        try:
            with open(partial, "wb") as handle:
                handle.write(marshal.dumps(code))
            os.replace(partial, entry)  # whole or absent for every reader
        except OSError:
            pass
        return code

    return compile_cached


def install(importer_class=zipimport.zipimporter, cache_dir=CODE_CACHE):
    """Patch ``importer_class`` (and, with ``cache_dir``, zipimport's compile).

    Returns False where this Python has no double compile to remove."""
    module_code = getattr(zipimport, "_get_module_code", None)
    compile_source = getattr(zipimport, "_compile_source", None)
    if module_code is None or compile_source is None or getattr(importer_class, "hypeman_vgpu_compiled_once", False):
        return False
    plain_get_code = importer_class.get_code

    def get_filename(self, fullname):
        code, _ispackage, modpath = module_code(self, fullname)
        # Kept for the get_code that follows; one entry per name, replaced by a later find.
        self.__dict__.setdefault("_compiled_once", {})[fullname] = code
        return modpath

    def get_code(self, fullname):
        compiled = self.__dict__.get("_compiled_once")
        if compiled and fullname in compiled:
            return compiled.pop(fullname)
        return plain_get_code(self, fullname)

    importer_class.get_filename = get_filename
    importer_class.get_code = get_code
    importer_class.hypeman_vgpu_compiled_once = True
    if cache_dir:
        # zipimport's functions look the name up in their module at each call.
        zipimport._compile_source = cached_compile(compile_source, cache_dir)  # pylint: disable=protected-access
    return True


if __name__ == PTH_NAME:
    install()
