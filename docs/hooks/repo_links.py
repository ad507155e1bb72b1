"""MkDocs hook: links from a docs page to a file of the repository outside docs/ (README.md, examples/, notebooks/).

On the forge these relative links work as written. On the site they would point nowhere, so this hook checks that
the file exists (a missing one fails `mkdocs build --strict`, as a broken link between pages does) and turns the link
into one to the file on the forge (`repo_url` in mkdocs.yml), or, without a `repo_url`, into the file's path as text.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.repo_links")

LINK = re.compile(r"\[([^\]]*)\]\((\.\./[^)\s#]+)(#[^)\s]*)?\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs = Path(config["docs_dir"]).resolve()
    root = docs.parent
    page_dir = posixpath.dirname(page.file.src_uri)

    def outside(match: re.Match[str]) -> str:
        text, target, anchor = match.group(1), match.group(2), match.group(3) or ""
        path = (docs / page_dir / target).resolve()
        if path.is_relative_to(docs):
            return match.group(0)  # a page of the site: mkdocs checks it
        if not path.is_relative_to(root) or not path.exists():
            log.warning("Doc file '%s' links to '%s', which is not in the repository", page.file.src_uri, target)
            return match.group(0)
        relative = path.relative_to(root).as_posix()
        repo = (config.get("repo_url") or "").rstrip("/")
        if repo:
            kind = "tree" if path.is_dir() else "blob"
            return f"[{text}]({repo}/{kind}/main/{relative}{anchor})"
        return text if text.strip("`").rstrip("/") == relative else f"{text} (`{relative}` in the repository)"

    return LINK.sub(outside, markdown)
