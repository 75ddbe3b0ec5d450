# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The import rules of plugins/module_utils (docs/architecture.md, "Import rules").

Every import statement of every plugins/module_utils/*.py and
plugins/modules/*.py is read with ``ast``, including imports inside functions
(the lazy ones that keep the helper payload light): they are edges all the
same, and a cycle through a lazy import is still a cycle.
"""

from __future__ import annotations

import ast
import os
import sys

import pytest

from ansible_collections.hypeman.vgpu.plugins.module_utils import _errors

PACKAGE = "ansible_collections.hypeman.vgpu.plugins.module_utils"
COLLECTION = "ansible_collections.hypeman.vgpu"
MODULE_UTILS_DIR = os.path.dirname(os.path.abspath(_errors.__file__))
MODULES_DIR = os.path.join(os.path.dirname(MODULE_UTILS_DIR), "modules")

# Foundation helpers: every helper may import them, and they import no helper
# (so they can never be part of a cycle).
FOUNDATION = {"_errors", "_fileio", "_gotime", "_payload_loader"}

# Every other module_utils -> module_utils edge the design allows (importer -> imported).
# A new edge is a design change: add it here and to the table in docs/architecture.md.
LAYERED = {
    "_api": {"_passthrough", "_sysfs"},
    "_audit": {"_api", "_hypeman", "_ledger", "_metrics", "_placement", "_prerequisites", "_sentinel",
               "_sentinel_mode", "_store", "_store_write", "_wedge"},
    "_busy": {"_hypeman", "_proc", "_sriov", "_sysfs"},
    "_canary": {"_api", "_sentinel"},
    "_cmd": set(),
    "_gojson": {"_govalues"},
    "_govalues": set(),
    "_hypeman": {"_govalues", "_pci", "_proc"},
    "_ledger": set(),
    "_ledger_write": {"_ledger", "_safedir"},
    "_marker": {"_safedir"},
    "_metrics": set(),
    "_module": set(),
    "_pci": set(),
    "_safedir": set(),
    "_passthrough": set(),
    "_placement": {"_hypeman", "_passthrough", "_placement_whatif", "_proc", "_store", "_sysfs", "_wedge"},
    "_placement_whatif": {"_govalues", "_sysfs"},
    "_prerequisites": {"_proc", "_sysfs"},
    "_proc": set(),
    "_sentinel": {"_hypeman"},
    "_sentinel_mode": {"_sentinel"},
    "_sentinel_write": {"_safedir", "_sentinel"},
    "_sriov": {"_sysfs"},
    "_store": {"_gojson", "_govalues", "_pci", "_store_serialize"},
    "_store_serialize": set(),
    "_store_write": {"_pci", "_safedir", "_store"},
    "_sysfs": {"_govalues", "_pci"},
    "_wedge": {"_cmd", "_hypeman", "_ledger", "_sysfs"},
}

ALLOWED = dict((name, set(FOUNDATION)) for name in LAYERED)
for _name, _imported in LAYERED.items():
    ALLOWED[_name] |= _imported
ALLOWED.update((name, set()) for name in FOUNDATION)

# Edges left out of the cycle check: none. (_store and _gojson used to import
# each other; the value shapes both decoders build now live in _govalues.)
# Adding an entry needs a design decision recorded in docs/architecture.md.
KNOWN_CYCLE_EDGES = set()

# Helpers imported only inside the function that needs them, never at module
# level: they cost import time on every run that does not use them
# (docs/placement.md, "Performance").
LAZY_ONLY = {"_api", "_gojson"}

# Helpers a plain audit (host_audit_info without metrics_url, api_url,
# prerequisites or a broken store) must not load at import time: AnsiballZ ships
# sources and every loaded one is compiled on every host (docs/performance.md,
# "Audit cost per host"). Writers, the HTTP clients, the card-holder scans and
# gpu_sriov's wording, the prerequisite checks, the placement what-if and the
# store's serializer stay out.
AUDIT_NOT_EAGER = {"_api", "_busy", "_gojson", "_ledger_write", "_metrics", "_placement_whatif", "_prerequisites",
                   "_safedir", "_sentinel_write", "_sriov", "_store_serialize", "_store_write"}

# The only ansible imports module_utils may make (they run on the managed host):
# the HTTP client, and _module, the AnsibleModule glue, reading the raw arguments.
ALLOWED_ANSIBLE = {"_api": {"ansible.module_utils.urls"}, "_module": {"ansible.module_utils.basic", "ansible.module_utils"}}


def _stdlib(name):
    return name.split(".")[0] in sys.stdlib_module_names


def _resolve_relative(node, importer_package):
    """Absolute module name of a relative ``from`` import (``from ._x import y``)."""
    parts = importer_package.split(".")
    base = parts[:len(parts) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def read_imports(path, importer_package):
    """``[(imported module, imported names, lazy, line)]`` for every import in the file.

    ``lazy`` is true for imports that are not at module level (inside a
    function, class, ``if`` or ``try``). Calls to ``importlib.import_module``
    and ``__import__`` count as imports when their argument is a literal and
    make the test fail otherwise: an edge this test cannot see is not allowed.
    """
    with open(path, "rb") as handle:
        tree = ast.parse(handle.read(), filename=path)
    top_level = set(id(node) for node in tree.body)
    found = []
    for node in ast.walk(tree):
        lazy = id(node) not in top_level
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append((alias.name, [], lazy, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            module = _resolve_relative(node, importer_package) if node.level else (node.module or "")
            found.append((module, [alias.name for alias in node.names], lazy, node.lineno))
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("import_module", "__import__"):
                arg = node.args[0] if node.args else None
                if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
                    raise AssertionError("%s:%d: dynamic import with a computed name" % (path, node.lineno))
                found.append((arg.value, [], True, node.lineno))
    return found


def module_utils_targets(module, names):
    """The module_utils helpers an import names (``pkg import _a, _b`` or ``pkg._a import x``)."""
    if module == PACKAGE:
        return list(names)
    if module.startswith(PACKAGE + "."):
        return [module[len(PACKAGE) + 1:].split(".")[0]]
    return []


def _py_files(directory):
    return sorted(name[:-3] for name in os.listdir(directory)
                  if name.endswith(".py") and name != "__init__.py")


def build_graph(module_utils_dir=MODULE_UTILS_DIR, modules_dir=MODULES_DIR):
    """``(helpers, edges, imports)``: edges maps (importer, imported) to ``[(lazy, line)]``
    for module_utils -> module_utils imports; imports has every import of every file."""
    helpers = _py_files(module_utils_dir)
    edges = {}
    imports = {}
    for directory, kind, package in ((module_utils_dir, "module_utils", PACKAGE),
                                     (modules_dir, "modules", COLLECTION + ".plugins.modules")):
        for name in _py_files(directory):
            found = read_imports(os.path.join(directory, name + ".py"), package)
            imports[(kind, name)] = found
            if kind != "module_utils":
                continue
            for module, names, lazy, line in found:
                for target in module_utils_targets(module, names):
                    edges.setdefault((name, target), []).append((lazy, line))
    return helpers, edges, imports


def find_cycle(nodes, edges):
    """One cycle as a list of nodes (first == last), or None."""
    succ = dict((node, sorted(set(b for (a, b) in edges if a == node))) for node in nodes)
    state = {}
    path = []

    def visit(node):
        state[node] = "open"
        path.append(node)
        for nxt in succ.get(node, []):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        state[node] = "done"
        path.pop()
        return None

    for node in sorted(nodes):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def reaches(edges, start, goal):
    """Whether ``goal`` can be reached from ``start`` along ``edges``."""
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node == goal:
            return True
        if node not in seen:
            seen.add(node)
            todo.extend(b for (a, b) in edges if a == node)
    return False


GRAPH = build_graph()


def test_the_tree_was_found():
    helpers, edges, imports = GRAPH
    assert "_store" in helpers and "_errors" in helpers
    assert ("modules", "vf_health") in imports
    assert edges, "no module_utils edge found: the parser is broken"


def test_every_helper_is_in_the_allowed_table():
    helpers = GRAPH[0]
    assert sorted(set(helpers) - set(ALLOWED)) == [], "add the new helper to ALLOWED and docs/architecture.md"


def test_imports_name_existing_helpers():
    helpers, _edges, imports = GRAPH
    wrong = []
    for (kind, name), found in sorted(imports.items()):
        for module, names, _lazy, line in found:
            for target in module_utils_targets(module, names):
                if target not in helpers:
                    wrong.append("%s/%s.py:%d imports module_utils.%s, which does not exist" % (kind, name, line, target))
    assert wrong == []


def test_foundation_helpers_import_no_helper():
    _helpers, edges, _imports = GRAPH
    assert sorted("%s -> %s" % edge for edge in edges if edge[0] in FOUNDATION) == []


def test_no_edge_outside_the_allowed_table():
    _helpers, edges, _imports = GRAPH
    extra = ["%s.py:%d imports %s (not in ALLOWED)" % (a, where[0][1], b)
             for (a, b), where in sorted(edges.items()) if b not in ALLOWED.get(a, set())]
    assert extra == [], "new module_utils edges; if intended, add them to ALLOWED and docs/architecture.md"


def test_no_import_cycle_among_helpers():
    helpers, edges, _imports = GRAPH
    checked = dict((edge, where) for edge, where in edges.items() if edge not in KNOWN_CYCLE_EDGES)
    cycle = find_cycle(helpers, checked)
    assert cycle is None, "import cycle: %s" % " -> ".join(cycle)


def test_known_cycle_exceptions_are_still_needed():
    helpers, edges, _imports = GRAPH
    for edge in sorted(KNOWN_CYCLE_EDGES):
        assert edge in edges, "%s -> %s is gone: remove it from KNOWN_CYCLE_EDGES" % edge
        assert all(lazy for lazy, _line in edges[edge]), "%s -> %s must stay a lazy import" % edge
        importer, imported = edge
        assert reaches(edges, imported, importer), (
            "%s -> %s no longer closes a cycle: remove it from KNOWN_CYCLE_EDGES" % edge)


def test_lazy_only_helpers_are_never_imported_at_module_level():
    _helpers, _edges, imports = GRAPH
    eager = []
    for (kind, name), found in sorted(imports.items()):
        for module, names, lazy, line in found:
            for target in module_utils_targets(module, names):
                if target in LAZY_ONLY and not lazy:
                    eager.append("%s/%s.py:%d imports %s at module level" % (kind, name, line, target))
    assert eager == []


def test_helpers_import_only_the_standard_library_and_each_other():
    _helpers, _edges, imports = GRAPH
    wrong = []
    for (kind, name), found in sorted(imports.items()):
        if kind != "module_utils":
            continue
        for module, names, _lazy, line in found:
            if module == "__future__" or _stdlib(module) or module_utils_targets(module, names):
                continue
            if module in ALLOWED_ANSIBLE.get(name, set()):
                continue
            wrong.append("module_utils/%s.py:%d imports %s" % (name, line, module))
    assert wrong == [], "module_utils runs on the managed host: standard library only"


def test_modules_import_no_plugin_code_but_module_utils():
    _helpers, _edges, imports = GRAPH
    wrong = []
    for (kind, name), found in sorted(imports.items()):
        if kind != "modules":
            continue
        for module, names, _lazy, line in found:
            if module == "__future__" or _stdlib(module) or module_utils_targets(module, names):
                continue
            if module == "ansible.module_utils.basic":
                continue
            wrong.append("modules/%s.py:%d imports %s" % (name, line, module))
    assert wrong == [], "modules import the standard library, AnsibleModule and this collection's module_utils only"


def test_modules_import_the_payload_loader_before_any_other_helper():
    # Helpers imported before it would be compiled twice by zipimport on every run.
    _helpers, _edges, imports = GRAPH
    wrong = []
    for (kind, name), found in sorted(imports.items()):
        helper_imports = [(line, module_utils_targets(module, names)) for module, names, lazy, line in found
                          if not lazy and module_utils_targets(module, names)]
        if kind != "modules" or not helper_imports:
            continue
        line, first = min(helper_imports)
        if first != ["_payload_loader"]:
            wrong.append("modules/%s.py:%d imports %s first" % (name, line, ", ".join(first)))
    assert wrong == [], "a module's first helper import is _payload_loader, alone"


def eager_closure(imports, kind, name):
    """The helpers ``kind/name`` loads at import time: module-level imports, followed transitively."""
    seen, todo = set(), [(kind, name)]
    while todo:
        current = todo.pop()
        for module, names, lazy, _line in imports.get(current, []):
            for target in module_utils_targets(module, names):
                if not lazy and target not in seen:
                    seen.add(target)
                    todo.append(("module_utils", target))
    return seen


def test_the_audit_loads_no_writer_or_optional_helper_at_import():
    _helpers, _edges, imports = GRAPH
    loaded = eager_closure(imports, "modules", "host_audit_info")
    assert "_audit" in loaded and "_store" in loaded, "the closure is broken: %s" % sorted(loaded)
    assert sorted(loaded & AUDIT_NOT_EAGER) == []


# -- the checks themselves must be able to fail ------------------------------------------------


def _tree(tmp_path, helpers, modules=None):
    mu, mods = tmp_path / "module_utils", tmp_path / "modules"
    mu.mkdir()
    mods.mkdir()
    for name, text in helpers.items():
        (mu / (name + ".py")).write_text(text)
    for name, text in (modules or {}).items():
        (mods / (name + ".py")).write_text(text)
    return build_graph(str(mu), str(mods))


def test_lazy_and_relative_imports_are_edges(tmp_path):
    helpers, edges, _imports = _tree(tmp_path, {
        "_a": "def f():\n    from %s import _b\n" % PACKAGE,
        "_b": "from ._c import thing\n",
        "_c": "import %s._a\n" % PACKAGE,
    })
    assert helpers == ["_a", "_b", "_c"]
    assert edges == {("_a", "_b"): [(True, 2)], ("_b", "_c"): [(False, 1)], ("_c", "_a"): [(False, 1)]}
    assert find_cycle(helpers, edges) == ["_a", "_b", "_c", "_a"]


def test_a_graph_without_cycles_passes():
    assert find_cycle(["_a", "_b", "_c"], {("_a", "_b"): [], ("_b", "_c"): [], ("_a", "_c"): []}) is None


def test_a_self_import_is_a_cycle():
    assert find_cycle(["_a"], {("_a", "_a"): []}) == ["_a", "_a"]


def test_a_computed_dynamic_import_fails(tmp_path):
    with pytest.raises(AssertionError, match="dynamic import"):
        _tree(tmp_path, {"_a": "import importlib\nimportlib.import_module('x' + 'y')\n"})


def test_the_eager_closure_follows_module_level_imports_only(tmp_path):
    _helpers, _edges, imports = _tree(tmp_path, {
        "_a": "from %s import _b\ndef f():\n    from %s import _c\n" % (PACKAGE, PACKAGE),
        "_b": "from ._d import thing\n",
        "_c": "", "_d": "",
    }, {"mod": "from %s import _a\n" % PACKAGE})
    assert eager_closure(imports, "modules", "mod") == {"_a", "_b", "_d"}
