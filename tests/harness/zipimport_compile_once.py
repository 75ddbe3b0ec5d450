# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Test harness: zipimport compiles each module of a zip file once, not twice.

Every module Ansible runs arrives as an AnsiballZ payload, a zip file Python
imports from with ``zipimport``. On Python 3.11 and 3.12 ``zipimport`` compiles
a module's source twice: finding it asks ``get_filename``, which compiles to
learn the file name, and loading it compiles again (``get_code``). For a
``ping`` that is about half of the module process's CPU; across the
integration phase's thousands of module runs, a fifth of its CPU
(docs/testing.md, "Modules compiled once").

This patch keeps the code object ``get_filename`` compiled and hands that same
object to the ``get_code`` that follows. Nothing else changes: the same
source, compiled by the same function to the same file name, runs exactly as
before. The collection's own ``_payload_loader`` does the same for its
helpers on managed hosts; Ansible's own ``module_utils`` are imported before
any module code runs, so only the test machine's interpreter can do it for
them.

Loaded at interpreter start by a ``.pth`` file that ``scripts/bootstrap.sh``
puts in the test venvs, and only where ``MARKER`` exists: ``scripts/test.sh``
creates it in the private ``/tmp`` of its integration phases, so benchmarks,
the demo and every other use of those venvs run the interpreter unchanged.
The ``.pth`` runs this file as ``PTH_NAME``, which installs the patch.
"""

from __future__ import annotations

import zipimport

MARKER = "/tmp/.hypeman-vgpu-zipimport-compile-once"
PTH_NAME = "hypeman_vgpu_zipimport_compile_once"


def install(importer_class=zipimport.zipimporter):
    """Patch ``importer_class``; returns False where this Python has no double compile to remove."""
    module_code = getattr(zipimport, "_get_module_code", None)
    if module_code is None or getattr(importer_class, "hypeman_vgpu_compiled_once", False):
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
    return True


if __name__ == PTH_NAME:
    install()
