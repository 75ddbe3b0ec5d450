# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible's collection loader for the inventory tests, as ansible-test units installs it.

An inventory plugin is found by its collection name (``hypeman.vgpu.vgpu_fleet``)
only through Ansible's collection finder. ansible-test installs it before any
test is imported; a plain pytest run (``PYTHONPATH=.collections``) gets the same
here, before anything imports ``ansible_collections``.
"""

from __future__ import annotations

import importlib.util
import os

from ansible.utils.collection_loader import AnsibleCollectionConfig

if AnsibleCollectionConfig.collection_finder is None:
    from ansible.plugins.loader import init_plugin_loader

    # Where PYTHONPATH finds ansible_collections (found, not imported: the finder must import it).
    _spec = importlib.util.find_spec("ansible_collections")
    init_plugin_loader([os.path.dirname(path) for path in _spec.submodule_search_locations])
