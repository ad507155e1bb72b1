"""The README and CONTRIBUTING.md stay true to the code."""

from __future__ import annotations

import re
from pathlib import Path

from spark_jetstream.options import options_markdown

README = Path(__file__).resolve().parents[1] / "README.md"
CONTRIBUTING = README.parent / "CONTRIBUTING.md"


def test_readme_option_table_is_generated_from_the_option_definitions():
    text = README.read_text()
    table = re.search(r"<!-- options-table:start -->\n(.*?)\n<!-- options-table:end -->", text, re.S)
    assert table, "the README lost its options table markers"
    assert table.group(1) == options_markdown(), "regenerate it from spark_jetstream.options.options_markdown()"


def test_readme_starts_with_the_two_setup_commands():
    lines = README.read_text().splitlines()
    commands = lines[lines.index("```bash") + 1 : lines.index("```bash") + 3]
    assert commands == [
        "pip install '.[demo]' && spark-jetstream demo",
        "pip install '.[test]' && python -m pytest -n 3",
    ]
    ci = (README.parent / ".ci" / "run").read_text().strip().splitlines()[-1]
    install, run = commands[1].split(" && ")
    assert ci.startswith(install) and ci.endswith(run), "CI runs the README's command (after the fast tier)"


def test_the_layout_names_every_module():
    """Every module of the package has its row in CONTRIBUTING.md's Layout table (paths relative to the package
    from the subpackages on), and every row names a module that exists."""
    package = README.parent / "spark_jetstream"
    layout = CONTRIBUTING.read_text().split("## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = set(re.findall(r"^\| \*{0,2}`([a-z_/.]+\.py)`", layout, re.M))
    listed = {row.removeprefix("spark_jetstream/") for row in rows if not row.startswith("bench/")}
    modules = {str(p.relative_to(package)) for p in package.rglob("*.py") if p.name != "__init__.py"}
    assert listed == modules
