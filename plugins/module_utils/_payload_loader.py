# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Load this collection's helpers from a module's AnsiballZ payload, compiling each once.

Ansible ships a module and its helpers to the managed host as source files in
a zip file, and Python imports them with ``zipimport``, which compiles the
source of every module it loads twice (Python 3.11 and 3.12: finding the
module asks ``get_filename``, which compiles; loading compiles again). For a
plain audit that was about 30 ms of CPU per host and run, a third of what the
module process added to a ``ping``'s (docs/performance.md, "Audit cost per host").

A module imports this helper first. When this file was itself loaded from a
zip file (a payload), it puts a finder ahead of the standard ones that serves
only this package's own modules: it reads a helper's source from the same zip
file and compiles it once, to the same file name zipimport would give.
Anywhere else (the controller, unit tests, an unpacked payload) it installs
nothing. A name it does not serve (anything outside this package, a package,
a helper the zip file lacks) is left to the standard import system.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import zipimport
from importlib.machinery import ModuleSpec

_PACKAGE = __name__.rpartition(".")[0]


class SourceOnceLoader:
    """Loads one helper from the payload's source, compiled once."""

    def __init__(self, filename, source):
        self.filename = filename
        self.source = source

    def create_module(self, spec):  # pylint: disable=unused-argument
        return None  # the default module object

    def exec_module(self, module):
        code = compile(self.source, self.filename, "exec", dont_inherit=True)
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

    @staticmethod
    def find_spec(fullname, path=None, target=None):  # pylint: disable=unused-argument
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
            spec = ModuleSpec(fullname, SourceOnceLoader(filename, source), origin=filename)
            spec.has_location = True
            return spec
        return None


def install():
    """Put the finder first on ``sys.meta_path``, once; only inside a payload (see the module docstring)."""
    if not isinstance(getattr(__spec__, "loader", None), zipimport.zipimporter):
        return False
    if not any(isinstance(finder, PayloadHelperFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, PayloadHelperFinder())
    return True


install()
