# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Shared testinfra fixtures for the molecule scenarios (loaded through --rootdir).

molecule's podman driver connects with Ansible's podman connection, which
testinfra can only drive through Ansible: one ad-hoc Ansible run per command.
``sh`` talks to the same container through testinfra's own podman backend
(``podman exec``) for plain commands and files; ``host`` stays for module runs.
"""

from __future__ import annotations

import pytest
import testinfra


@pytest.fixture(scope="module")
def sh(host):
    return testinfra.get_host("podman://%s" % host.backend.host)
