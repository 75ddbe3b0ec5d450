# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Shared argument checks and the last-resort guard of every module (``_module.run_module``).

Every path option of every module must be a usable absolute path, API options
must be sane, arguments nested too deeply to read and unexpected exceptions
end in a failure result: never a traceback.
"""

from __future__ import annotations

import json
from unittest import mock

import pytest
from hypothesis import given, settings, strategies as st

from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from ansible_collections.hypeman.vgpu.plugins.module_utils import _module, _placement
from ansible_collections.hypeman.vgpu.plugins.modules import (
    gpu_holders_info, gpu_sriov, host_audit_info, path_access_info, vf_health, vf_health_info, vgpu_canary,
    vgpu_instance_info, run_marker, vgpu_placement_info, vgpu_sentinel_scan)
from ansible_collections.hypeman.vgpu.tests.unit.plugins.modules.module_results import argument_spec, run_module

# Each module with the arguments it requires.
MODULES = {
    "vf_health": (vf_health.main, {"state": "repaired"}),
    "vf_health_info": (vf_health_info.main, {}),
    "vgpu_placement_info": (vgpu_placement_info.main, {}),
    "vgpu_instance_info": (vgpu_instance_info.main, {}),
    "gpu_holders_info": (gpu_holders_info.main, {}),
    "vgpu_sentinel_scan": (vgpu_sentinel_scan.main, {}),
    "gpu_sriov": (gpu_sriov.main, {"pci_address": "0000:82:00.0"}),
    "host_audit_info": (host_audit_info.main, {}),
    "run_marker": (run_marker.main, {"name": "dcgm-quiesce.json", "state": "read"}),
}
# Modules outside the host-path action group (no host-path option): each with the option that
# takes nested values. Their path checks are in their own tests (test_path_access_info.py).
OUTSIDE_GROUP = {
    "path_access_info": (path_access_info.main, "paths"),
}

BAD_PATHS = [
    ("/var/lib/hype\x00man", "contains a NUL byte at offset 13"),
    ("var/lib/hypeman", "is a relative path ('var/lib/hypeman'); expected an absolute path"),
    ("", "is a relative path (''); expected an absolute path"),
    ("/" + "d/" * 2100, "bytes long"),
    ("/var/" + "n" * 256, "has a name of 256 bytes"),
    ("/var/\ud800", "contains a lone surrogate at offset 5"),
]


def _path_options(main):
    """``(option, is_list)`` for every path-typed option of a module."""
    out = []
    for name, spec in sorted(argument_spec(main).items()):
        if spec.get("type") == "path":
            out.append((name, False))
        elif spec.get("type") == "list" and spec.get("elements") == "path":
            out.append((name, True))
    return out


def test_every_module_has_the_shared_path_options():
    for name, (main, _required) in MODULES.items():
        options = dict(_path_options(main))
        assert set(options) >= {"data_dir", "path", "sysfs_root", "proc_root", "dev_root", "state_dir",
                                "config_path"}, name


@pytest.mark.parametrize("module", sorted(MODULES))
@pytest.mark.parametrize("value, words", BAD_PATHS, ids=["nul", "relative", "empty", "too-long", "long-name",
                                                         "surrogate"])
def test_a_bad_path_option_fails_naming_it(module, value, words, capsys, tmp_path):
    main, required = MODULES[module]
    for option, is_list in _path_options(main):
        params = dict(required, data_dir=str(tmp_path), _ansible_check_mode=True)
        params[option] = ["/etc", value] if is_list else value
        result = run_module(main, params, capsys)
        label = "%s[1]" % option if is_list else option
        assert result.get("failed") is True, (module, option, result)
        assert result["msg"].startswith(label + " ") and words in result["msg"], (module, option, result["msg"])
        assert "exception" not in result


@pytest.mark.parametrize("args, words", [
    ({"api_url": "http://127.0.0.1:1/\x00"}, "api_url contains a NUL byte at offset 19"),
    ({"api_url": "http://127.0.0.1:1/\t"}, "api_url 'http://127.0.0.1:1/\\t' contains a space or control"),
    ({"api_url": "ftp://host/"}, "is not an http:// or https:// URL"),
    ({"api_url": "http://"}, "is not an http:// or https:// URL"),
    ({"api_url": "http://h/" + "x" * 3000}, "api_url is 3009 characters long; expected at most 2048"),
    ({"api_url": "http://h", "api_token": "abc\r\nX-Evil: 1"}, "api_token contains a control character"),
    ({"api_url": "http://h", "api_timeout": float("nan")}, "api_timeout is nan; expected a number of seconds"),
    ({"api_url": "http://h", "api_timeout": float("inf")}, "api_timeout is inf"),
    ({"api_url": "http://h", "api_timeout": 0}, "api_timeout is 0.0"),
    ({"api_url": "http://h", "api_timeout": -5}, "api_timeout is -5.0"),
    ({"api_url": "http://h", "api_timeout": 3601}, "at most 3600"),
])
def test_bad_api_options_fail_naming_them(args, words, capsys, tmp_path):
    result = run_module(vgpu_placement_info.main, dict(args, data_dir=str(tmp_path)), capsys)
    assert result.get("failed") is True and words in result["msg"], result
    assert "X-Evil" not in result["msg"]


def test_a_lone_surrogate_in_a_string_option_fails_naming_it(capsys, tmp_path):
    result = run_module(vgpu_placement_info.main, {"data_dir": str(tmp_path), "profile": "L40S-\ud800"}, capsys)
    assert result["failed"] is True
    assert result["msg"] == "profile contains a lone surrogate at offset 5 ('L40S-\\ud800'); expected text in UTF-8"


def test_a_nul_byte_in_a_string_option_fails_naming_it(capsys, tmp_path):
    result = run_module(vgpu_instance_info.main, {"data_dir": str(tmp_path), "parent_gpu": "0000:82\x00:00.0"}, capsys)
    assert result["msg"] == ("parent_gpu contains a NUL byte at offset 7 ('0000:82\\x00:00.0'); "
                             "expected text without NUL bytes")


def test_a_lone_surrogate_in_the_token_is_named_without_quoting_it(capsys, tmp_path):
    params = {"data_dir": str(tmp_path), "api_url": "http://127.0.0.1:1", "api_token": "s3cret-\ud800"}
    result = run_module(vgpu_placement_info.main, params, capsys)
    assert result["msg"] == "api_token contains a lone surrogate at offset 7; expected text in UTF-8"


def _deep(depth):
    value = []
    for _level in range(depth):
        value = [value]
    return value


def test_the_modules_are_the_action_group_and_the_rest():
    import os
    import yaml

    root = os.path.dirname(os.path.dirname(os.path.abspath(path_access_info.__file__)))
    with open(os.path.join(os.path.dirname(root), "meta", "runtime.yml")) as handle:
        group = yaml.safe_load(handle)["action_groups"]["host"]
    modules = sorted(name[:-3] for name in os.listdir(os.path.join(root, "modules"))
                     if name.endswith(".py") and not name.startswith("_"))
    assert sorted(group) == sorted(set(MODULES) | {"vgpu_canary"})
    # fleet_report_write is a controller-side action plugin's documentation stub.
    assert sorted(set(modules) - set(group)) == sorted(set(OUTSIDE_GROUP) | {"fleet_report_write"})
    for name in OUTSIDE_GROUP:
        assert not set(argument_spec(OUTSIDE_GROUP[name][0])) & {"data_dir", "state_dir", "sysfs_root"}, name


@pytest.mark.parametrize("module", sorted(MODULES) + sorted(OUTSIDE_GROUP))
@pytest.mark.parametrize("depth", [600, 100000])  # deeper than AnsibleModule can copy / than JSON can decode
def test_arguments_nested_too_deeply_fail_cleanly(module, depth, capsys):
    if module in OUTSIDE_GROUP:
        main, option = OUTSIDE_GROUP[module]
        required = {}
    else:
        (main, required), option = MODULES[module], "data_dir"
    # Built by hand: the test harness's own encoder cannot nest that deep either.
    args = json.dumps({"ANSIBLE_MODULE_ARGS": dict(required, **{option: "DEEP"})}).replace(
        '"DEEP"', "[" * depth + "]" * depth)
    with mock.patch.object(basic, "_ANSIBLE_ARGS", args.encode()), mock.patch.object(basic, "_ANSIBLE_PROFILE",
                                                                                     "legacy"):
        with pytest.raises(SystemExit):
            main()
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["failed"] is True
    assert result["msg"].startswith("module arguments are nested too deeply to read")
    assert "Traceback" not in captured.err


def test_an_unexpected_exception_is_an_internal_error_result(capsys, tmp_path, monkeypatch):
    def explode(*_args, **_kwargs):
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

    monkeypatch.setattr(_placement, "host_view", explode)
    result = run_module(vgpu_placement_info.main, {"data_dir": str(tmp_path)}, capsys)
    assert result["failed"] is True
    assert result["msg"].startswith("internal error: UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff")


def test_a_recursion_error_is_named(capsys, tmp_path, monkeypatch):
    def recurse(*args, **kwargs):
        return recurse(*args, **kwargs)

    monkeypatch.setattr(_placement, "host_view", recurse)
    result = run_module(vgpu_placement_info.main, {"data_dir": str(tmp_path)}, capsys)
    assert result["failed"] is True
    assert result["msg"].startswith("internal error: input nested too deeply to process (RecursionError")


def test_a_result_that_cannot_be_encoded_fails_cleanly(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(_placement, "host_view",
                        lambda *args, **kwargs: ({"unreadable_metadata": [], "deep": _deep(2000)}, []))
    result = run_module(vgpu_placement_info.main, {"data_dir": str(tmp_path)}, capsys)
    assert result["failed"] is True
    assert result["msg"].startswith("internal error: the result cannot be returned")


@pytest.mark.parametrize("args, words", [
    ({"timeout": float("inf")}, "timeout is inf; expected a number of seconds from 0 to 86400"),
    ({"timeout": float("nan")}, "timeout is nan"),
    ({"timeout": -1}, "timeout is -1.0"),
    ({"delay": float("inf")}, "delay is inf; expected a number of seconds more than 0 and at most 3600"),
    ({"delay": 0}, "delay is 0.0"),
    ({"retries": -1}, "retries is -1; expected 0 to 100"),
    ({"retries": 10 ** 12}, "retries is 1000000000000; expected 0 to 100"),
])
def test_gpu_sriov_waits_are_bounded(args, words, capsys, tmp_path):
    params = dict(args, pci_address="0000:82:00.0", sysfs_root=str(tmp_path), _ansible_check_mode=True)
    result = run_module(gpu_sriov.main, params, capsys)
    assert result["failed"] is True and words in result["msg"], result


@pytest.mark.parametrize("unit, words", [
    ("../../etc/passwd", "is not a systemd unit name"), ("", "is not a systemd unit name"),
    ("..", "is not a systemd unit name"), ("u" * 256, "is not a systemd unit name"),
    ("a\x00b", "contains a NUL byte at offset 1"),
])
def test_host_audit_refuses_a_unit_that_is_not_a_name(unit, words, capsys, tmp_path):
    params = {"data_dir": str(tmp_path), "prerequisites": True, "dcgm_units": ["nvidia-dcgm.service", unit]}
    result = run_module(host_audit_info.main, params, capsys)
    assert result["failed"] is True
    assert result["msg"].startswith("dcgm_units") and words in result["msg"]


class _Built(Exception):
    pass


def _built_params(main, params):
    """The parameters ``main``'s module body would get for ``params`` (the body is not run)."""
    built = {}

    def capture(module, _body):
        built.update(module.params)
        raise _Built()

    with patch_module_args(params), mock.patch.object(_module, "run_module", capture), \
            mock.patch.object(path_access_info, "run_module", capture):
        with pytest.raises(_Built):
            main()
    return built


def _defaulted(main, required):
    return sorted(name for name, spec in argument_spec(main).items()
                  if spec.get("default") is not None and name not in required)


# Every module with arguments it needs, and each option given as null (top-level, or inside
# path_access_info's paths) that has a default.
NULLABLE = dict((name, (main, required, _defaulted(main, required)))
                for name, (main, required) in dict(MODULES, vgpu_canary=(vgpu_canary.main, {"gpu": "0000:82:00.0"})).items())
PATHS_ENTRY = {"path": "/etc"}
PATHS_DEFAULTED = sorted(n for n, s in argument_spec(path_access_info.main)["paths"]["options"].items()
                         if s.get("default") is not None)


def test_every_module_has_options_with_defaults():
    # The property below must not pass by finding nothing to null.
    assert all(len(options) >= 6 for _main, _required, options in NULLABLE.values())
    assert PATHS_DEFAULTED == ["access", "follow", "type"]


@pytest.mark.parametrize("module", sorted(NULLABLE))
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_an_option_given_as_null_is_the_option_left_out(module, data):
    """An inventory variable with no value, handed on by a role, must mean "not set", not fail or become ''."""
    main, required, options = NULLABLE[module]
    nulled = data.draw(st.lists(st.sampled_from(options), min_size=1, unique=True))
    params = dict(required, _ansible_check_mode=True)
    assert _built_params(main, dict(params, **dict.fromkeys(nulled))) == _built_params(main, params)


@settings(max_examples=15, deadline=None)
@given(nulled=st.lists(st.sampled_from(PATHS_DEFAULTED), min_size=1, unique=True), top=st.booleans())
def test_a_suboption_given_as_null_is_the_suboption_left_out(nulled, top):
    entry = dict(PATHS_ENTRY, **dict.fromkeys(nulled))
    params = {"paths": [PATHS_ENTRY, entry], "_ansible_check_mode": True}
    expected = _built_params(path_access_info.main, {"paths": [PATHS_ENTRY, PATHS_ENTRY], "_ansible_check_mode": True})
    assert _built_params(path_access_info.main, params) == expected
    if top:
        assert _built_params(path_access_info.main, {"paths": None}) == _built_params(path_access_info.main, {})


def test_a_null_required_option_still_fails_naming_it(capsys):
    result = run_module(gpu_sriov.main, {"pci_address": None, "_ansible_check_mode": True}, capsys)
    assert result["failed"] is True and "pci_address" in result["msg"]
