"""The package's rooms stay as they are described (docs/how-it-works.md): no
import circle between its modules or its subpackages, no source file over 400
lines (the M2 scorer aside), the package root holding the decoding core and
the fairseq integration only."""
import ast
import os
from collections import defaultdict

from helpers import ROOT

PACKAGE = os.path.join(ROOT, "fairseq_aggressive")
MAX_LINES = 400
LONG_ALLOWED = {os.path.join("evaluation", "m2.py")}
ROOT_MODULES = {"__init__", "acceptance", "compat", "constants", "decoding", "decoding_options", "distributed",
                "draft_budget", "draft_policy", "engines", "generator", "model_shapes", "options", "registration",
                "shortlist", "stats", "translator"}


def _modules():
    mods = {}
    for d, dirs, files in os.walk(PACKAGE):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(d, f), ROOT)[:-3].replace(os.sep, ".")
                mods[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(d, f)
    return mods


def _imports(mods):
    """module -> the package's modules it imports (at the top or inside a function)."""
    graph = defaultdict(set)
    for mod, path in mods.items():
        pkg = mod if path.endswith("__init__.py") else mod.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            targets = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                while t and t not in mods:
                    t = t.rsplit(".", 1)[0] if "." in t else ""
                if t and t != mod and t != "fairseq_aggressive":
                    graph[mod].add(t)
    return graph


def _cycles(graph):
    """Pairs (a, b) with a path a -> b and b -> a."""
    def reaches(a, b):
        seen, todo = set(), [a]
        while todo:
            for n in graph.get(todo.pop(), ()):
                if n == b:
                    return True
                if n not in seen:
                    seen.add(n)
                    todo.append(n)
        return False

    return sorted({tuple(sorted((a, b))) for a in list(graph) for b in graph[a] if reaches(b, a)})


def test_no_import_circles_between_modules_or_subpackages():
    mods = _modules()
    graph = _imports(mods)
    assert _cycles(graph) == []
    room = lambda m: (m.split(".") + ["__init__"])[1]  # noqa: E731  (the subpackage, or the root module)
    rooms = defaultdict(set)
    for a, bs in graph.items():
        for b in bs:
            if room(a) != room(b):
                rooms[room(a)].add(room(b))
    assert _cycles(rooms) == []


def test_a_circle_would_be_found():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [("a", "b"), ("a", "c"), ("b", "c")]
    assert _cycles({"a": {"b"}, "b": {"c"}}) == []


def test_no_source_file_over_400_lines():
    long = []
    for d, dirs, files in os.walk(PACKAGE):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        for f in files:
            if f.endswith((".py", ".cpp", ".h")):
                path = os.path.join(d, f)
                rel = os.path.relpath(path, PACKAGE)
                if rel not in LONG_ALLOWED and sum(1 for _ in open(path, encoding="utf-8")) > MAX_LINES:
                    long.append(rel)
    assert long == []


def test_the_package_root_holds_the_core_and_the_fairseq_integration():
    root = {f[:-3] for f in os.listdir(PACKAGE) if f.endswith(".py")}
    assert root == ROOT_MODULES
