"""mkdocs hooks (``mkdocs.yml`` ``hooks:``): the reference pages made from the code.

The HTTP API, the configuration, the command line and the metrics pages are written at
build time from what the code itself declares (the OpenAPI document, the settings' field
docs, the argparse parsers, what ``GET /metrics`` exposes), so nothing generated is
committed and nothing can go stale. The Python client's page is mkdocstrings' (its
docstrings); this module only turns their Sphinx roles (``:func:`x```) into code.

mkdocs puts this file's directory on ``sys.path`` while it loads it, so the generators
beside it import as top-level modules.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import api_reference
import cli_reference
import config_reference
import metrics_reference
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

#: Each generated page: its place in ``docs/`` and the function that writes it.
GENERATED: dict[str, Callable[[], str]] = {
    "reference/http-api.md": api_reference.page,
    "reference/configuration.md": config_reference.page,
    "reference/cli.md": cli_reference.page,
    "reference/metrics.md": metrics_reference.page,
}

# ``:func:`connect``` in a docstring reaches the HTML as ``:func:<code>connect</code>``;
# ``:meth:`Viewer.leave <lipstream_client.viewer.Viewer.leave>``` keeps its target too.
_ROLE = re.compile(
    r":(?:func|class|meth|attr|mod|data|exc|obj):(<code>[^<]*?)(?: &lt;[^&]*&gt;)?(</code>)"
)


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for uri, write in GENERATED.items():
        files.append(File.generated(config, uri, content=write()))
    return files


def on_page_content(html: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    return _ROLE.sub(r"\1\2", html)
