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
``CODE_CACHE`` with the collection's own bytecode cache
(``_payload_loader.BytecodeCache``, loaded by path), keyed by the source's
hash and the interpreter's bytecode version, as Python's own ``__pycache__``
does for plain files: a later process loads it and gives it its own file
name (``_imp._fix_co_filename``, what Python does when a ``.pyc`` moved).
Nothing else changes: the same source, compiled by the same function, runs
exactly as before, under the file name zipimport gives it. On managed hosts
``_payload_loader`` does the same for the collection's own helpers; Ansible's
own ``module_utils`` are imported before any module code runs, so only the
interpreter (or this patch) can help them. The ``.pth`` passes this file's
path as ``__file__``: the loader lies at ``plugins/module_utils`` beside
``tests/harness``.

Loaded at interpreter start by a ``.pth`` file that ``scripts/bootstrap.sh``
puts in the test venvs, and only where ``MARKER`` exists: ``scripts/test.sh``
creates it in the private ``/tmp`` of its integration phases, so benchmarks
and every other use of those venvs run the interpreter unchanged. The
simulated host's image (test equipment) loads it always. The ``.pth`` runs
this file as ``PTH_NAME``, which installs the patch.
"""

from __future__ import annotations

import os
import zipimport

MARKER = "/tmp/.hypeman-vgpu-zipimport-compile-once"
CODE_CACHE = "/tmp/.hypeman-vgpu-zipimport-code"
PTH_NAME = "hypeman_vgpu_zipimport_compile_once"
# The collection's bytecode cache, relative to the repository root (two levels above this file).
LOADER = os.path.join("plugins", "module_utils", "_payload_loader.py")


def _bytecode_cache(cache_dir):
    """The collection's own bytecode cache (``_payload_loader.BytecodeCache``), its file loaded by path."""
    import importlib.util  # pylint: disable=import-outside-toplevel  # loaded only by a process that imports from a zip

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    spec = importlib.util.spec_from_file_location("hypeman_vgpu_payload_loader", os.path.join(root, LOADER))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # outside a payload it installs nothing
    # Written even under PYTHONDONTWRITEBYTECODE: the phase's own /tmp, gone with it.
    return module.BytecodeCache(cache_dir, write=True)


def cached_compile(compile_source, cache_dir):
    """``zipimport._compile_source`` that keeps each source's code in ``cache_dir``."""
    cache = []

    def compile_cached(pathname, source):
        if not cache:
            cache.append(_bytecode_cache(cache_dir))
        # The module's path inside the payload, as the entry's stem: the same for every payload.
        stem = pathname.rpartition(".zip" + os.sep)[2].replace(os.sep, ".")
        return cache[0].code(stem, source, pathname, compile_source)

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
