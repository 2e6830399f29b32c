"""The README and the documentation pages a newcomer reads: the README stays short and every page it names
exists; the site builds with ``mkdocs build --strict`` (no broken link, no page outside the nav); the site's home
page is the README; and the README's Python quickstarts run as written.

``python tests/test_docs.py`` rewrites ``docs/index.md`` from the README."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
INDEX = ROOT / "docs" / "index.md"


def index_from_readme(text: str) -> str:
    """The site's home page: the README with its links made relative to ``docs/`` (files outside docs/ named as
    code: the site has no page for them)."""
    text = text.replace("](docs/", "](")
    return re.sub(r"\[([^\]]+)\]\((?!https?://)(\.\./)?((?:deploy|benchmarks|tests|scalemb)/[^)]+)\)", r"`\3`", text)


def _blocks(text: str, language: str) -> list:
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def test_readme_is_short_and_its_links_exist():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    for target in re.findall(r"\]\(((?!https?://)[^)#]+)\)", text):
        assert (ROOT / target).exists(), target
    assert _blocks(text, "bash")[:2] == ['python -m pip install -e . && scalemb embed --out grqc.zarr --overwrite\n',
                                         'python -m pip install -e ".[test]" && python -m pytest -q\n']


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
def test_readme_python_quickstarts_run(tmp_path):
    for code in _blocks(README.read_text(), "python"):
        done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, (code, done.stderr)


if __name__ == "__main__":
    INDEX.write_text(index_from_readme(README.read_text()))
