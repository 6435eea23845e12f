"""The codebase keeps the shape the design pages (``docs/design/``) describe.

References resolve inside the repository, imports point down, no module imports itself
through others, every package lists its public surface, and long modules say why they
are long.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections import deque
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("config", "inference_core", "compositor", "streaming", "web")
DESIGN = REPO / "docs" / "design"
SITE_HOOKS = REPO / "scripts" / "docs_site"
TEXT_SUFFIXES = {".py", ".md", ".html", ".js", ".yaml", ".toml", ".sh", ".cfg"}
MAX_MODULE_LINES = 400

# Which top-level package may import which (docs/design/map.md §1).
ALLOWED_IMPORTS = {
    "config": set(),
    "inference_core": {"config"},
    "compositor": {"config"},
    "streaming": {"config", "inference_core", "compositor"},
    "web": {"config", "inference_core", "compositor", "streaming"},
}
# Inside a package, which sub-package may import which (absent: only itself and the
# package's own top-level modules such as ``exceptions``).
ALLOWED_SUBPACKAGE_IMPORTS = {
    "inference_core.avatars": {"inference_core.adapter"},
    "inference_core.features": {"inference_core.adapter"},
    "inference_core.serving": {"inference_core.adapter", "inference_core.avatars"},
    "inference_core.importers": {"inference_core.adapter", "inference_core.avatars"},
    "inference_core.assets": {
        "inference_core.adapter",
        "inference_core.avatars",
        "inference_core.features",
    },
    "streaming.live": {
        "streaming.audio_in",
        "streaming.webrtc",
        "streaming.idle_loops",
        "streaming.link",
        "streaming.broadcast",
    },
    "streaming.broadcast": {"streaming.webrtc", "streaming.idle_loops", "streaming.link"},
    # A LiveKit agent's avatar is a live session with a room as its sink: above live.
    "streaming.livekit": {
        "streaming.live",
        "streaming.audio_in",
        "streaming.webrtc",
        "streaming.broadcast",
    },
    "streaming.idle_loops": {"streaming.webrtc"},
    "streaming.webrtc": {"streaming.link"},
    "streaming.offline": {"streaming.audio_in"},
    "web.cluster": {"web.schemas", "web.inference"},
    "web.inference": {"web.schemas"},
    "web.cli": {"web.cluster"},
}


def _repo_files() -> list[Path]:
    skip = {".git", ".venv", "node_modules", "__pycache__", ".mypy_cache", ".ruff_cache"}
    return [
        path
        for path in REPO.rglob("*")
        if path.is_file()
        and path.suffix in TEXT_SUFFIXES
        and not skip.intersection(path.relative_to(REPO).parts)
    ]


def _modules() -> list[Path]:
    return [path for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _design_sections() -> dict[str, set[str]]:
    """Each design page's sections: ``# §N Title { #sN }`` (or ``##``), by page name."""
    heading = re.compile(r"^#{1,2} §(\d+) .*\{ #s(\d+) \}$", re.M)
    pages = {}
    for page in sorted(DESIGN.glob("*.md")):
        found = heading.findall(page.read_text(encoding="utf-8"))
        assert all(number == anchor for number, anchor in found), (page.name, found)
        pages[page.name] = {number for number, _ in found}
    return pages


def test_every_design_section_is_on_one_page_with_its_anchor() -> None:
    pages = _design_sections()
    numbers = sorted(int(n) for sections in pages.values() for n in sections)
    assert numbers == list(range(1, len(numbers) + 1)), numbers  # each once, none missing
    assert len(numbers) >= 21


def test_every_design_reference_names_a_section_on_its_page() -> None:
    """A citation is ``docs/design/<page>.md §N`` (``§N, §M``, ``§N-§M``): the page must
    exist and hold a heading of each section named."""
    pages = _design_sections()
    cite = re.compile(
        r"docs/design/([\w-]+\.md)`{0,2}\s+(?:(?:#:?|//)\s*)?"
        r"((?:§\d+(?:[-–]§?\d+)?(?:,\s*|\s+and\s+)?)+)"
    )
    wrong = []
    cited = 0
    for path in _repo_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in cite.finditer(text):
            page, numbers = match.group(1), re.findall(r"\d+", match.group(2))
            for number in numbers:
                cited += 1
                if number not in pages.get(page, set()):
                    line = text.count("\n", 0, match.start()) + 1
                    held = sorted(pages.get(page, set()), key=int)
                    where = f"it holds §{', §'.join(held)}" if held else "no such page"
                    wrong.append(f"{path.relative_to(REPO)}:{line}: {page} §{number} ({where})")
    assert cited > 200  # the code does cite it
    assert not wrong, "citations of a section its page does not hold:\n" + "\n".join(wrong)


def _generated_pages() -> set[Path]:
    """The site's pages written at build time (``GENERATED`` in the mkdocs hooks)."""
    hooks = ast.parse((SITE_HOOKS / "hooks.py").read_text(encoding="utf-8"))
    for node in ast.walk(hooks):
        if isinstance(node, ast.AnnAssign | ast.Assign) and "GENERATED" in ast.unparse(node):
            assert isinstance(node.value, ast.Dict)
            keys = [k.value for k in node.value.keys if isinstance(k, ast.Constant)]
            return {(REPO / "docs" / key).resolve() for key in keys}
    raise AssertionError("no GENERATED table in scripts/docs_site/hooks.py")


def test_no_reference_points_at_a_document_outside_the_repository() -> None:
    mention = re.compile(r"(?<![\w/.-])((?:\.\./|\./)?[\w./-]*[\w-]\.md)\b")
    generated = _generated_pages()
    assert generated
    broken = []
    for path in _repo_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        # the page generators write links relative to the page they make
        base = REPO / "docs" / "reference" if path.parent == SITE_HOOKS else path.parent
        for match in mention.finditer(text):
            name = match.group(1)
            before = text[max(0, match.start() - 8) : match.start()]
            if "://" in before or name.startswith("http"):
                continue
            candidates = (
                base / name,
                REPO / name,
                REPO / "docs" / name,
                REPO / "docs" / Path(name).name,
            )
            if not any(
                c.resolve().is_relative_to(REPO) and (c.is_file() or c.resolve() in generated)
                for c in candidates
            ):
                line = text.count("\n", 0, match.start()) + 1
                broken.append(f"{path.relative_to(REPO)}:{line}: {name}")
    assert not broken, "references to documents not in this repository:\n" + "\n".join(broken)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_imports_point_down() -> None:
    wrong = []
    for path in _modules():
        module = _module_name(path)
        package = module.split(".")[0]
        for imported in _imports(path):
            target = imported.split(".")[0]
            if target in PACKAGES and target != package:
                if target not in ALLOWED_IMPORTS[package]:
                    wrong.append(f"{module} imports {imported}")
                continue
            if target != package:
                continue
            # Inside one package: sub-packages only import what their rule allows.
            source_sub = ".".join(module.split(".")[:2])
            target_sub = ".".join(imported.split(".")[:2])
            subpackages = {p.parent.name for p in (REPO / package).glob("*/__init__.py")}
            if (
                source_sub != package
                and source_sub.split(".")[1] in subpackages
                and target_sub.split(".")[-1] in subpackages
                and target_sub != source_sub
                and target_sub not in ALLOWED_SUBPACKAGE_IMPORTS.get(source_sub, set())
            ):
                wrong.append(f"{module} imports {imported}")
    assert not wrong, "imports that point up or sideways (docs/design/map.md §1):\n" + "\n".join(
        sorted(wrong)
    )


#: Where each top-level package of the module graph lives.
GRAPH_ROOTS = {
    **{package: REPO for package in PACKAGES},
    "benchmarks": REPO,
    "lipstream_client": REPO / "clients" / "python",
}


def _module_graph(roots: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules it imports, read from the source (never imported).

    What counts as an edge: every ``import`` statement anywhere in the file (top level,
    inside functions, under ``if TYPE_CHECKING:``, in ``try``), relative ones resolved
    against the importing module's package. ``import a.b.c`` is an edge to ``a.b.c``, the
    module named, not to ``a`` and ``a.b`` whose ``__init__`` Python also runs: a package
    re-exporting its modules would otherwise be a cycle with each of them. ``from a.b
    import c`` is an edge to ``a.b.c`` when that is a module, else to ``a.b``. Only
    modules under ``roots`` are nodes; a module importing itself is no edge.
    """
    files: dict[str, tuple[Path, bool]] = {}
    for top, base in roots.items():
        for path in sorted((base / top).rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            files[".".join(parts)] = (path, is_package)
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in files.items():
        package = name if is_package else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names if alias.name in files)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base_parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join([*base_parts, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                for alias in node.names:
                    if f"{source}.{alias.name}" in files:
                        edges.add(f"{source}.{alias.name}")
                    elif source in files:
                        edges.add(source)
        edges.discard(name)
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import cycle, as paths ``[a, b, ..., a]``: for each group of modules that
    reach one another (a strongly connected component), a shortest cycle through each of
    its modules, each cycle once."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(start: str) -> None:  # Tarjan's algorithm, iterative
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            target = next(edges, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                groups.append(group)

    for module in sorted(graph):
        if module not in index:
            visit(module)
    cycles: list[list[str]] = []
    seen: set[tuple[str, ...]] = set()
    for group in groups:
        if len(group) < 2:
            continue
        for start in sorted(group):
            cycle = _shortest_cycle(graph, group, start)
            turn = cycle.index(min(cycle[:-1]))  # one rotation per cycle
            key = tuple(cycle[turn:-1] + cycle[:turn])
            if key not in seen:
                seen.add(key)
                cycles.append(cycle)
    return cycles


def _shortest_cycle(graph: dict[str, set[str]], group: set[str], start: str) -> list[str]:
    """A shortest path ``start -> ... -> start`` inside ``group`` (breadth first)."""
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for target in sorted(graph[node] & group):
            if target == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if target not in came_from:
                came_from[target] = node
                queue.append(target)
    raise AssertionError(f"{start} is in a cycle group but on no cycle")


def test_no_import_cycle_between_modules() -> None:
    """A cycle makes import order matter and hides which module is the lower one; the
    entry point, the app factory and the cluster once imported each other in a circle."""
    cycles = _cycles(_module_graph(GRAPH_ROOTS))
    assert not cycles, "import cycles between modules:\n" + "\n".join(
        " -> ".join(cycle) for cycle in cycles
    )


def test_the_cycle_check_sees_imports_in_functions_and_under_type_checking(
    tmp_path: Path,
) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from pkg.a import A\n")
    (package / "a.py").write_text("def f():\n    from pkg.sub import b\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..c import C\n"
    )
    (package / "c.py").write_text("import pkg.a\n")
    (package / "d.py").write_text("import pkg.sub\n")  # the package, not its modules
    graph = _module_graph({"pkg": tmp_path})
    assert graph["pkg.a"] == {"pkg.sub.b"}  # a submodule named by from-import
    assert graph["pkg.d"] == {"pkg.sub"}
    assert _cycles(graph) == [["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]]


@pytest.mark.parametrize(
    "package",
    sorted(
        _module_name(init)
        for package in PACKAGES
        for init in [REPO / package / "__init__.py", *(REPO / package).glob("*/__init__.py")]
    ),
)
def test_every_package_lists_its_public_surface(package: str) -> None:
    module = importlib.import_module(package)
    assert module.__doc__, f"{package} has no docstring saying what it owns"
    names = getattr(module, "__all__", None)
    assert names, f"{package}/__init__.py has no __all__"
    assert sorted(names) == sorted(set(names)), f"{package}.__all__ repeats a name"
    for name in names:
        assert hasattr(module, name), f"{package}.__all__ names {name!r}, which it lacks"


#: The modules allowed past MAX_MODULE_LINES, each with the one concept a split would
#: scatter. An entry is a reviewed decision: add one in the change that needs it, with a
#: reason a reviewer accepts (else split the module); it leaves once its module is back
#: under the bound.
LONG_MODULES = {
    "config/settings.py": "every setting, checked in the order of the example file",
    "inference_core/adapter/serving_graph.py": "one pass over one graph, sharing its names",
    "inference_core/features/stream.py": "one state machine over four buffers trimmed together",
    "inference_core/serving/registry.py": "load states, placement and eviction share entries",
    "inference_core/serving/scheduler.py": "state guarded by one condition variable",
    "streaming/live/timeline.py": "one audio clock: chunks, the speech gate, deferred silence",
    "streaming/webrtc/compat.py": "the one place that touches aiortc's and aioice's internals",
    "streaming/webrtc/peer.py": "the one holder of the RTCPeerConnection of a call",
    "web/cluster/grpc_front.py": "one routing table for every call of both gRPC services",
    "web/inference/binary_tensors.py": "each reading step bounds the next",
    "web/inference/oip_grpc.py": "the protocol's twelve calls, registered together",
    "web/inference/rest.py": "the protocol's routes sharing one error wrapper and admin rule",
    "web/metrics.py": "one metric table, the histograms and the collector name one series",
    "web/openapi.py": "the error-code table beside the code that renders it",
    "web/schemas/routes.py": "one table: the API's index",
    "clients/python/lipstream_client/call.py": "connect builds exactly the call Call drains",
    "clients/python/lipstream_client/pipecat.py": "one service whose four tasks share state",
}
#: No module is longer, listed or not: today's longest (web/schemas/routes.py, 875
#: lines) with room for its table to grow.
MAX_LONG_MODULE_LINES = 1000


def test_long_modules_are_the_listed_ones() -> None:
    """The rule on module length, as reviewed: a module (the packages' and the Python
    client's) over MAX_MODULE_LINES lines is in LONG_MODULES, with the one-line reason a
    split would scatter one concept; a listed module that exists and is back at or under
    MAX_MODULE_LINES leaves the list; and no module passes MAX_LONG_MODULE_LINES."""
    client = sorted((REPO / "clients" / "python" / "lipstream_client").rglob("*.py"))
    lengths = {
        str(path.relative_to(REPO)): path.read_text(encoding="utf-8").count("\n")
        for path in [*_modules(), *client]
    }
    unlisted = [
        f"{name}: {lines} lines"
        for name, lines in sorted(lengths.items())
        if lines > MAX_MODULE_LINES and name not in LONG_MODULES
    ]
    assert not unlisted, (
        f"modules over {MAX_MODULE_LINES} lines that LONG_MODULES does not allow (split "
        "them, or list each with the one concept a split would scatter):\n" + "\n".join(unlisted)
    )
    stale = [
        f"{name}: {lengths.get(name, 'no such module')}"
        for name in LONG_MODULES
        if lengths.get(name, 0) <= MAX_MODULE_LINES
    ]
    assert not stale, "LONG_MODULES entries no longer long (remove them):\n" + "\n".join(stale)
    too_long = [
        f"{name}: {lines} lines"
        for name, lines in sorted(lengths.items())
        if lines > MAX_LONG_MODULE_LINES
    ]
    assert not too_long, f"modules over {MAX_LONG_MODULE_LINES} lines:\n" + "\n".join(too_long)


CLIENT = REPO / "clients" / "python" / "lipstream_client"
#: What the Python client may not import: the server, and what only the server needs.
CLIENT_FORBIDDEN = (*PACKAGES, "onnxruntime", "onnx", "cv2")


def test_the_python_client_imports_nothing_of_the_server() -> None:
    modules = sorted(CLIENT.rglob("*.py"))
    assert modules, f"no modules under {CLIENT}"
    wrong = [
        f"{path.relative_to(REPO)} imports {imported}"
        for path in modules
        for imported in _imports(path)
        if imported.split(".")[0] in CLIENT_FORBIDDEN
    ]
    assert not wrong, "lipstream_client must talk to the server over HTTP only:\n" + "\n".join(
        wrong
    )
