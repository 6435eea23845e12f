"""The documentation site builds, strictly, from this tree (``mkdocs.yml``).

``mkdocs build --strict`` fails on a broken link, a link to a missing anchor, a page in
the nav that does not exist and a page that exists but is in no nav. The reference pages
are generated while it builds (``scripts/docs_site/hooks.py``): from the OpenAPI
document, the settings' field docs, the command's parsers, a real ``/metrics`` scrape and
the Python client's docstrings; each is checked for what it must hold.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from config.settings import Settings
from web.openapi import openapi_document

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    # No network is needed: no web fonts, no social cards, nothing fetched by a plugin.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def _page(site: Path, path: str) -> str:
    return (site / path / "index.html").read_text(encoding="utf-8")


def test_every_operation_of_the_openapi_document_is_on_the_api_page(site: Path) -> None:
    page = _page(site, "reference/http-api")
    document = openapi_document()
    for item in document["paths"].values():
        for method, operation in item.items():
            if isinstance(operation, dict) and "operationId" in operation:
                assert f'id="{operation["operationId"]}"' in page, (method, operation)
    for name in document["components"]["schemas"]:
        assert f'id="schema-{name.lower()}"' in page, name


def test_every_setting_is_on_the_configuration_page(site: Path) -> None:
    page = _page(site, "reference/configuration")
    for section, field in Settings.model_fields.items():
        model = field.annotation
        assert isinstance(model, type)
        for name in model.model_fields:
            assert f"LIPSTREAM_{section.upper()}__{name.upper()}" in page, (section, name)


def test_the_cli_and_metrics_pages_come_from_the_code(site: Path) -> None:
    cli = _page(site, "reference/cli")
    for command in ("lipstream serve", "lipstream avatar import synctalk2d", "lipstream health"):
        assert f"<code>{command}</code>" in cli, command
    metrics = _page(site, "reference/metrics")
    for name in (
        "lipstream_sessions_live",
        "lipstream_frames_dropped_total",
        "lipstream_link_calls_by_step",
        "lipstream_cluster_workers",
    ):
        assert name in metrics, name
    assert "_created" not in metrics  # prometheus_client's companion series are not families


def test_the_python_client_page_is_its_docstrings(site: Path) -> None:
    page = _page(site, "reference/python-client")
    assert "lipstream_client.Call" in page or 'id="lipstream_client.Call"' in page
    assert "switch_avatar" in page
    assert ":func:" not in page  # Sphinx roles become code


def test_each_design_section_keeps_its_anchor(site: Path) -> None:
    found = set()
    for page in (site / "design").glob("*/index.html"):
        html = page.read_text(encoding="utf-8")
        found |= {n for n in range(1, 40) if f'id="s{n}"' in html}
    assert found == set(range(1, len(found) + 1))
    assert len(found) >= 21
