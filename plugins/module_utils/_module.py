# -*- coding: utf-8 -*-
# Copyright: hypeman.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""AnsibleModule glue: the only helper that imports AnsibleModule machinery.

Keeps the host-path argument specs in one place so every module accepts the
same options with the same defaults as the doc fragments document, and is
every module's entry: :func:`new_module` builds the AnsibleModule,
:func:`run_module` checks the shared options, runs the module's body and
turns every failure into a clean result -- never a traceback.
"""

from __future__ import annotations

import json
import math
import os
import sys

from ansible_collections.hypeman.vgpu.plugins.module_utils._errors import VgpuError

HOST_PATH_SPECS = {
    "data_dir": {"data_dir": dict(type="path", default="/var/lib/hypeman"),
                 "path": dict(type="path")},
    "sysfs_root": {"sysfs_root": dict(type="path", default="/sys")},
    "proc_root": {"proc_root": dict(type="path", default="/proc")},
    "dev_root": {"dev_root": dict(type="path", default="/dev")},
    "state_dir": {"state_dir": dict(type="path", default="/var/lib/hypeman-vgpu")},
    "config_path": {"config_path": dict(type="path", default="/etc/hypeman/config.yaml")},
    "api": {"api_url": dict(type="str"),
            "api_token": dict(type="str", no_log=True),
            "validate_certs": dict(type="bool", default=True),
            "api_timeout": dict(type="float", default=10)},
}

# Linux limits: a longer path or name fails in the kernel with ENAMETOOLONG.
PATH_MAX = 4096
NAME_MAX = 255
# The longest API URL and the longest API wait accepted.
URL_MAX = 2048
API_TIMEOUT_MAX = 3600
# How much of a bad value a message quotes.
_SHOWN = 80
_MSG_MAX = 2000


def host_path_spec(**extra):
    """Argument spec with every host-path and API option plus module options.

    module_defaults for group/hypeman.vgpu.host hands every default to every
    module of the group, so each module accepts them all and ignores the
    paths it does not read.
    """
    spec = {}
    for group in HOST_PATH_SPECS.values():
        spec.update({k: dict(v) for k, v in group.items()})
    spec.update(extra)
    return spec


def store_path(params):
    """The VF health store path: ``path`` when given, else under ``data_dir``."""
    return params.get("path") or os.path.join(params["data_dir"], "gpu", "vf-health.json")


def shown(value):
    """A value for a message: its repr, cut to a readable length."""
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


def _unencodable(text):
    """Offset of the first character no file name can hold (a lone surrogate), or None."""
    try:
        text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as err:
        return err.start
    return None


def path_problem(value):
    """Why ``value`` is not a usable absolute host path (words to follow its name), or None."""
    if not isinstance(value, str):
        return "is %s; expected an absolute path" % type(value).__name__
    problem = _text_problem(value, what="a path")
    if problem:
        return problem
    encoded = value.encode("utf-8", "surrogateescape")
    if len(encoded) > PATH_MAX:
        return "is %d bytes long (%s); expected at most %d (PATH_MAX)" % (len(encoded), shown(value), PATH_MAX)
    if not value.startswith("/"):
        return "is a relative path (%s); expected an absolute path" % shown(value)
    longest = max(encoded.split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        return "has a name of %d bytes (%s); expected at most %d bytes per name (NAME_MAX)" % (
            len(longest), shown(value), NAME_MAX)
    return None


def _text_problem(value, quote=True, what="text"):
    """A NUL byte or a lone surrogate in a string option (no option of this collection takes either)."""
    if not isinstance(value, str):
        return None
    quoted = " (%s)" % shown(value) if quote else ""
    if "\0" in value:
        return "contains a NUL byte at offset %d%s; expected %s without NUL bytes" % (value.index("\0"), quoted, what)
    bad = _unencodable(value)
    if bad is not None:
        return "contains a lone surrogate at offset %d%s; expected %s in UTF-8" % (bad, quoted, what)
    return None


def _api_problems(params):
    url, token, timeout = params.get("api_url"), params.get("api_token"), params.get("api_timeout")
    if url is not None:
        if len(url) > URL_MAX:
            return "api_url is %d characters long; expected at most %d" % (len(url), URL_MAX)
        if any(ord(char) <= 32 or ord(char) == 127 for char in url):
            return "api_url %s contains a space or control character; expected a URL such as " \
                   "http://127.0.0.1:8080" % shown(url)
        if not url.lower().startswith(("http://", "https://")) or len(url.split("://", 1)[1]) == 0:
            return "api_url %s is not an http:// or https:// URL; expected one such as http://127.0.0.1:8080" \
                % shown(url)
    if token is not None and any(ord(char) < 32 or ord(char) == 127 for char in token):
        # The token itself is never quoted.
        return "api_token contains a control character (a newline or a NUL byte, for example); " \
               "expected a bearer token on one line"
    if timeout is not None and not (isinstance(timeout, (int, float)) and math.isfinite(timeout)
                                    and 0 < timeout <= API_TIMEOUT_MAX):
        return "api_timeout is %s; expected a number of seconds more than 0 and at most %d" % (
            timeout, API_TIMEOUT_MAX)
    return None


def argument_problem(argument_spec, params):
    """The first bad shared argument, as a message naming it, or None.

    Every ``path`` option (and ``list`` of ``path``) must be a usable
    absolute path: no NUL byte, within PATH_MAX/NAME_MAX, not relative.
    String options must be text a file name or JSON can carry. API options
    must be a plain http(s) URL, a one-line token and a bounded timeout.
    """
    for name in sorted(argument_spec):
        spec, value = argument_spec[name], params.get(name)
        if value is None:
            continue
        kind = spec.get("type", "str")
        if kind == "list":
            items, elements = list(value), spec.get("elements", "str")
            for index, item in enumerate(items):
                problem = path_problem(item) if elements == "path" else _text_problem(item)
                if problem:
                    return "%s[%d] %s" % (name, index, problem)
        elif kind == "path":
            problem = path_problem(value)
            if problem:
                return "%s %s" % (name, problem)
        elif kind == "str":
            problem = _text_problem(value, quote=not spec.get("no_log"))
            if problem:
                return "%s %s" % (name, problem)
    return _api_problems(params)


def _cause_chain(err):
    seen = []
    while err is not None and err not in seen:
        seen.append(err)
        err = err.__cause__ or err.__context__
    return seen


def _internal_message(err):
    """What an unexpected exception means, in words an operator can act on."""
    chain = _cause_chain(err)
    if any(isinstance(e, RecursionError) for e in chain):
        return "internal error: input nested too deeply to process (RecursionError: %s)" % err
    if any(isinstance(e, MemoryError) for e in chain):
        return "internal error: input too large to hold in memory (MemoryError)"
    text = "internal error: %s: %s" % (type(err).__name__, err)
    return text if len(text) <= _MSG_MAX else text[:_MSG_MAX] + "..."


def _traceback_text():
    import traceback  # only on the failure path: every module run imports this file

    return traceback.format_exc()


def _fail_raw(msg):
    """A failure result printed without an AnsibleModule (when none could be built)."""
    sys.stdout.write(json.dumps({"failed": True, "msg": msg}) + "\n")
    sys.stdout.flush()
    raise SystemExit(1)


def new_module(module_class, **kwargs):
    """``module_class(**kwargs)`` (the AnsibleModule), failing cleanly on arguments it cannot even read.

    An option given as null is read as one left out when it has a default
    (:func:`_nulls_omitted`). Arguments nested thousands of levels deep make AnsibleModule's own
    decoding and copying recurse without end: that becomes a failure result
    instead of a traceback. Anything else is AnsibleModule's to report.
    """
    problem = _raw_text_problem(kwargs.get("argument_spec") or {})
    if problem:
        _fail_raw(problem)
    try:
        return _nulls_omitted(module_class, kwargs.get("argument_spec") or {})(**kwargs)
    except Exception as err:  # pylint: disable=broad-except  # re-raised unless it is one of ours
        chain = _cause_chain(err)
        if any(isinstance(e, RecursionError) for e in chain):
            _fail_raw("module arguments are nested too deeply to read; expected options of plain strings, "
                      "numbers, booleans and flat lists")
        if any(isinstance(e, MemoryError) for e in chain):
            _fail_raw("module arguments are too large to read")
        if any(isinstance(e, UnicodeError) for e in chain):
            _fail_raw("module arguments contain text that is not UTF-8; expected UTF-8 text")
        raise


def _drop_defaulted_nulls(argument_spec, params):
    """Remove from ``params`` each option (or alias) given as null that has a default, suboptions too."""
    if not isinstance(params, dict):
        return
    for name, spec in argument_spec.items():
        keys = [name] + list(spec.get("aliases") or [])
        if spec.get("default") is not None:
            for key in keys:
                if key in params and params[key] is None:
                    del params[key]
        if spec.get("options"):
            for key in keys:
                value = params.get(key)
                for item in value if isinstance(value, list) else [value]:
                    _drop_defaulted_nulls(spec["options"], item)


def _nulls_omitted(module_class, argument_spec):
    """``module_class``, reading an option given as null as one left out where the option has a default.

    AnsibleModule applies a default only to an absent option: a null one (an
    inventory variable with no value, passed on by a role's ``default(omit)``)
    would fail the type check, or reach a path option as ``''``. The class's
    ``_load_params`` is Ansible's hook for modules that read their own arguments.
    """

    class NullsOmitted(module_class):
        def _load_params(self):
            super()._load_params()
            _drop_defaulted_nulls(argument_spec, self.params)

    return NullsOmitted


def _raw_text_problem(argument_spec):
    """A NUL byte or lone surrogate in the raw arguments, named, or None.

    Checked before AnsibleModule exists because it cannot even log such
    text (ansible-core 2.19 raises on a surrogate, 2.21 fails on a NUL byte
    in syslog without naming the option).
    """
    try:
        from ansible.module_utils import basic

        params = basic._load_params()  # pylint: disable=protected-access  # the raw arguments, as AnsibleModule gets them
    except Exception:  # pylint: disable=broad-except  # undecodable: AnsibleModule reports it, see new_module
        return None
    specs = {}
    for name, spec in argument_spec.items():
        for key in [name] + list(spec.get("aliases") or []):
            specs[key] = spec
    for name in sorted(params if isinstance(params, dict) else {}):
        spec, value = specs.get(name), params[name]
        if spec is None:
            continue  # unknown options are AnsibleModule's to refuse
        what = "a path" if spec.get("type") == "path" or spec.get("elements") == "path" else "text"
        for index, item in enumerate(value if isinstance(value, list) else [value]):
            problem = _text_problem(item, quote=not spec.get("no_log"), what=what)
            if problem:
                return "%s %s" % ("%s[%d]" % (name, index) if isinstance(value, list) else name, problem)
    return None


def run_module(module, body):
    """Check the shared arguments, run ``body(module)`` and exit with its result.

    A bad argument fails naming it; a VgpuError becomes a clean failure with
    its message; any other exception is a bug or an input no helper
    foresaw: it still ends in a failure result (``internal error: ...``
    with the traceback in ``exception``), never a traceback on stderr.
    """
    problem = argument_problem(module.argument_spec, module.params)
    if problem:
        module.fail_json(msg=problem)
    try:
        result = body(module)
    except VgpuError as err:
        module.fail_json(msg=err.msg, **err.details)
    except Exception as err:  # pylint: disable=broad-except  # the last-resort guard, see docstring
        module.fail_json(msg=_internal_message(err), exception=_traceback_text())
    try:
        module.exit_json(**result)
    except (RecursionError, MemoryError, TypeError, ValueError) as err:
        # exit_json could not encode the result: nothing was printed yet.
        module.fail_json(msg="internal error: the result cannot be returned: %s" % _internal_message(err),
                         exception=_traceback_text())


def run_host_module(module_class, body, options, **kwargs):
    """The ``main()`` of every module: host-path options plus ``options``, check mode supported.

    Builds the AnsibleModule (``module_class``) with :func:`new_module` (``kwargs``
    such as ``mutually_exclusive`` go to it) and runs ``body`` with :func:`run_module`.
    """
    module = new_module(module_class, argument_spec=host_path_spec(**options), supports_check_mode=True, **kwargs)
    run_module(module, body)
