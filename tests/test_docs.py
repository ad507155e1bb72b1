"""The README, the docs site and CONTRIBUTING.md stay true to the code and build."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from spark_jetstream.options import options_markdown
from spark_jetstream.tools.cli import cli_markdown

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CONTRIBUTING = ROOT / "CONTRIBUTING.md"
DOCS = ROOT / "docs"

# Pages that keep a record of how things were measured and decided: they may name test files and count runs.
RECORDS = ("decisions/", "benchmarks-archive.md", "DESIGN.md")
TEST_FILE = re.compile(r"tests/test_")
RUN_COUNT = re.compile(r"\b\d+ of (?:about )?\d+ (?:rounds|runs)\b|\bin \d+ (?:rounds|runs)\b|\bonce in \d+\b")


def _between(path: Path, marker: str) -> str:
    text = path.read_text()
    found = re.search(rf"<!-- {marker}:start -->\n(.*?)\n<!-- {marker}:end -->", text, re.S)
    assert found, f"{path.relative_to(ROOT)} lost its {marker} markers"
    return found.group(1)


def test_options_reference_is_generated_from_the_option_definitions():
    assert _between(DOCS / "reference" / "options.md", "options-table") == options_markdown(), (
        "regenerate it from spark_jetstream.options.options_markdown()"
    )


def test_cli_reference_is_generated_from_the_parser():
    assert _between(DOCS / "reference" / "cli.md", "cli-reference") == cli_markdown(), (
        "regenerate it from spark_jetstream.tools.cli.cli_markdown()"
    )


def test_readme_starts_with_the_two_setup_commands():
    lines = README.read_text().splitlines()
    commands = lines[lines.index("```bash") + 1 : lines.index("```bash") + 3]
    assert commands == [
        "pip install '.[demo]' && spark-jetstream demo",
        "pip install '.[test]' && python -m pytest -n 3",
    ]
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    install, run = commands[1].split(" && ")
    assert ci.startswith(install) and ci.endswith(run), "CI runs the README's command (after the fast tier)"


def test_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines <= 160, f"README.md has {lines} lines: keep it to the essentials and link to docs/"


def test_user_pages_cite_no_test_file_or_run_count():
    """A user page says what holds, not which test shows it or in how many runs."""
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        name = page.relative_to(DOCS).as_posix()
        if name.startswith(RECORDS):
            continue
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if TEST_FILE.search(line) or RUN_COUNT.search(line):
                found.append(f"docs/{name}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_docs_site_builds_strictly(tmp_path):
    """`mkdocs build --strict`: every page in the nav, every link and anchor found."""
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # without its banner about MkDocs 2
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "site" / "reference" / "options" / "index.html").exists()


def test_the_layout_names_every_module():
    """Every module of the package has its row in CONTRIBUTING.md's Layout table (paths relative to the package
    from the subpackages on), and every row names a module that exists."""
    package = ROOT / "spark_jetstream"
    layout = CONTRIBUTING.read_text().split("## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = set(re.findall(r"^\| \*{0,2}`([a-z_/.]+\.py)`", layout, re.M))
    listed = {row.removeprefix("spark_jetstream/") for row in rows if not row.startswith("bench/")}
    modules = {str(p.relative_to(package)) for p in package.rglob("*.py") if p.name != "__init__.py"}
    assert listed == modules
