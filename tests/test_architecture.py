"""The codebase keeps the shape docs/architecture.md describes.

References resolve inside the repository, imports point down, every package lists its
public surface, and long modules say why they are long.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("config", "inference_core", "compositor", "streaming", "web")
ARCHITECTURE = REPO / "docs" / "architecture.md"
TEXT_SUFFIXES = {".py", ".md", ".html", ".js", ".yaml", ".toml", ".sh", ".cfg"}
MAX_MODULE_LINES = 400

# Which top-level package may import which (docs/architecture.md §1).
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
    "streaming.live": {"streaming.audio_in", "streaming.webrtc"},
    "streaming.offline": {"streaming.audio_in"},
    "web.cluster": {"web.schemas"},
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


def test_every_architecture_reference_names_a_section_that_exists() -> None:
    sections = set(re.findall(r"^## §(\d+) ", ARCHITECTURE.read_text(encoding="utf-8"), re.M))
    assert sections == {str(n) for n in range(1, len(sections) + 1)}, sorted(sections, key=int)
    cite = re.compile(r"architecture\.md`{0,2}\s+((?:§\d+(?:[-–]§?\d+)?(?:,\s*)?)+)")
    missing = []
    cited = 0
    for path in _repo_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in cite.finditer(text):
            for number in re.findall(r"\d+", match.group(1)):
                cited += 1
                if number not in sections:
                    line = text.count("\n", 0, match.start()) + 1
                    missing.append(f"{path.relative_to(REPO)}:{line}: §{number}")
    assert cited > 20  # the code does cite it
    assert not missing, "no such section in docs/architecture.md:\n" + "\n".join(missing)


def test_no_reference_points_at_a_document_outside_the_repository() -> None:
    mention = re.compile(r"(?<![\w/.-])((?:\.\./|\./)?[\w./-]*[\w-]\.md)\b")
    broken = []
    for path in _repo_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in mention.finditer(text):
            name = match.group(1)
            before = text[max(0, match.start() - 8) : match.start()]
            if "://" in before or name.startswith("http"):
                continue
            candidates = (path.parent / name, REPO / name, REPO / "docs" / Path(name).name)
            if not any(c.resolve().is_relative_to(REPO) and c.is_file() for c in candidates):
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
    assert not wrong, "imports that point up or sideways (docs/architecture.md §1):\n" + "\n".join(
        sorted(wrong)
    )


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


def test_long_modules_say_why_they_are_long() -> None:
    unexplained = []
    client = sorted((REPO / "clients" / "python" / "lipstream_client").rglob("*.py"))
    for path in [*_modules(), *client]:
        lines = path.read_text(encoding="utf-8").count("\n")
        if lines <= MAX_MODULE_LINES:
            continue
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        if "why one module" not in doc.lower():
            unexplained.append(f"{path.relative_to(REPO)}: {lines} lines")
    assert not unexplained, (
        f"modules over {MAX_MODULE_LINES} lines without a 'Why one module' reason in their "
        "docstring:\n" + "\n".join(unexplained)
    )


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
