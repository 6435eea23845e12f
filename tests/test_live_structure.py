"""The live call stays composed, not wired (``docs/design/map.md`` §1,
``docs/design/threads.md`` §7).

A newcomer follows a frame through constructor arguments: the session is a thin owner
of a few parts, the functions of ``streaming/live`` each fit on a screen, and aiortc is
reached only through ``streaming/webrtc``, where the peer connection has its one owner.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("config", "inference_core", "compositor", "streaming", "web")
#: The most instance attributes the Session may hold.
MAX_SESSION_ATTRIBUTES = 15
#: The longest function (body and signature, blank lines and docstring included) in
#: streaming/live.
MAX_FUNCTION_LINES = 60


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _instance_attributes(cls: ast.ClassDef) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(cls):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        for target in targets:
            for element in ast.walk(target):
                if (
                    isinstance(element, ast.Attribute)
                    and isinstance(element.value, ast.Name)
                    and element.value.id == "self"
                ):
                    names.add(element.attr)
    return names


def test_the_session_is_a_thin_owner() -> None:
    tree = _tree(REPO / "streaming" / "live" / "session.py")
    (session,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Session"]
    attributes = _instance_attributes(session)
    assert len(attributes) <= MAX_SESSION_ATTRIBUTES, sorted(attributes)
    # Nothing is patched into a part after it is built: no assignment to another
    # object's attribute from the session (``renderer.decided = ...``).
    patched = [
        ast.unparse(node)
        for node in ast.walk(session)
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Attribute)
        and not (isinstance(target.value, ast.Name) and target.value.id == "self")
    ]
    assert not patched, patched


def test_no_function_in_streaming_live_is_over_60_lines() -> None:
    long = []
    for path in sorted((REPO / "streaming" / "live").glob("*.py")):
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                lines = (node.end_lineno or node.lineno) - first + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {lines}")
    assert not long, "functions over 60 lines:\n" + "\n".join(long)


def test_aiortc_is_imported_only_in_streaming_webrtc() -> None:
    wrong = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if path.is_relative_to(REPO / "streaming" / "webrtc"):
                continue
            for node in ast.walk(_tree(path)):
                names: list[str] = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                wrong += [
                    f"{path.relative_to(REPO)}:{node.lineno} imports {name}"
                    for name in names
                    if name.split(".")[0] in ("aiortc", "aioice")
                ]
    assert not wrong, "aiortc outside streaming/webrtc:\n" + "\n".join(wrong)
