# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Shared start of the zip-import probes run in a fresh interpreter (payload loader, zipimport patch)."""

from __future__ import annotations

# Counts compile() calls per file name (zipimport compiles with the builtin too) in ``compiled``.
COUNTING_COMPILE = r'''
import builtins, collections, json, sys, traceback
compiled = collections.Counter()
real_compile = builtins.compile
def counting_compile(source, filename, *args, **kwargs):
    compiled[str(filename).rsplit("/", 1)[-1]] += 1
    return real_compile(source, filename, *args, **kwargs)
builtins.compile = counting_compile
'''
