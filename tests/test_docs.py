"""The README and the documentation pages a newcomer reads: the README stays short and every page it names
exists; the site builds with ``mkdocs build --strict`` (no broken link, no page outside the nav); the site's home
page is the README; and the README's Python quickstarts run as written.

``python tests/test_docs.py`` rewrites ``docs/index.md`` from the README and ``docs/parameters.md`` from the
parameter table."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
INDEX = ROOT / "docs" / "index.md"
PARAMETERS = ROOT / "docs" / "parameters.md"


def index_from_readme(text: str) -> str:
    """The site's home page: the README with its links made relative to ``docs/`` (files outside docs/ named as
    code: the site has no page for them)."""
    text = text.replace("](docs/", "](")
    return re.sub(r"\[([^\]]+)\]\((?!https?://)(\.\./)?((?:deploy|benchmarks|tests|scalemb)/[^)]+)\)", r"`\3`", text)


def parameters_page() -> str:
    """``docs/parameters.md``: one row per setting of ``scalemb.params.PARAMS`` with its name in Python, on the
    command line and in the service's job body, its defaults, what a value must be and its help text."""
    from scalemb.params import _SAME, PARAMS

    def cell(text) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    def code(text) -> str:
        return f"`{text}`" if text else "-"

    aliases = {}
    for row in PARAMS:
        if row.alias_of:
            aliases.setdefault(row.alias_of, []).append(row.name)
        if row.estimator:
            aliases.setdefault(row.name, []).append(row.name)
    lines = ["# Parameters", "",
             "Every setting of a run, from the one parameter table `scalemb.params.PARAMS` (this page is generated "
             "from it: `python tests/test_docs.py`). The estimators take the Python name, `scalemb embed` the flag, "
             "the service's `POST /jobs` the field; the same bounds and the same one-line error apply on every "
             "front. Deprecated aliases still work in Python and warn.", "",
             "| Python | CLI flag | service field | default (Python) | default (CLI, service) | value | aliases "
             "(deprecated) | meaning |", "|---|---|---|---|---|---|---|---|"]
    for row in PARAMS:
        if row.alias_of:
            continue
        python = row.estimator or row.name
        own_aliases = [a for a in aliases.get(row.name, []) if a != python] + \
            ([row.name] if row.estimator and row.name != python else [])
        python_default = row.default if row.estimator_default is _SAME else row.estimator_default
        lines.append("| " + " | ".join([
            code(python), code(row.cli), code(row.service), code(repr(python_default)),
            code(repr(row.outer_default)) if (row.cli or row.service) else "-", cell(row.describe()),
            ", ".join(code(a) for a in sorted(set(own_aliases))) or "-", cell(row.help)]) + " |")
    return "\n".join(lines) + "\n"


def test_parameters_page_is_the_table():
    assert PARAMETERS.read_text() == parameters_page(), "run: python tests/test_docs.py"


def _blocks(text: str, language: str) -> list:
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def test_readme_is_short_and_its_links_exist():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    for target in re.findall(r"\]\(((?!https?://)[^)#]+)\)", text):
        assert (ROOT / target).exists(), target
    assert _blocks(text, "bash")[:2] == [
        'python -m pip install -e . && scalemb embed --out grqc.zarr --overwrite\n',
        'python -m pip install -e ".[test]" && python -m pytest -q -n 2 --dist loadfile\n']


def test_site_home_page_is_the_readme():
    assert INDEX.read_text() == index_from_readme(README.read_text()), "run: python tests/test_docs.py"


def test_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="pip install -e '.[docs]' (or '.[test]')")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "index.html").exists() and (tmp_path / "site" / "dask" / "index.html").exists()
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert {p for p in pages if p not in nav} == set()  # every page reachable from the nav


@pytest.mark.slow
def test_readme_python_quickstarts_run(tmp_path, monkeypatch, capsys):
    """Each block as ``python -c`` runs it (a namespace of its own named ``__main__``, the working directory an
    empty one), in this process: the interpreter start and imports are not what is checked."""
    monkeypatch.chdir(tmp_path)
    for code in _blocks(README.read_text(), "python"):
        exec(compile(code, "<README.md python block>", "exec"), {"__name__": "__main__"})
        assert capsys.readouterr().out.strip(), code  # each block prints its result


if __name__ == "__main__":
    INDEX.write_text(index_from_readme(README.read_text()))
    PARAMETERS.write_text(parameters_page())
