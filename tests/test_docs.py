"""The documentation: the site builds with `mkdocs build --strict` (every page in the nav, every link and
anchor resolving), the pages generated from the code are up to date, and the README stays a front page."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
GENERATE = "python docs/gen_reference.py"
sys.path[:0] = [str(DOCS)]

import gen_reference


def test_the_site_builds_strictly_and_offline(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="mkdocs is in the test extra: pip install -e '.[test]'")
    pytest.importorskip("material", reason="mkdocs-material is in the test extra: pip install -e '.[test]'")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()
    assert (tmp_path / "site" / "web-job.png").exists()  # the screenshots the README shows are served too
    built = "".join(p.read_text(encoding="utf-8", errors="replace") for p in (tmp_path / "site").rglob("*.html"))
    assert "fonts.googleapis.com" not in built and "fonts.gstatic.com" not in built  # nothing fetched at view time


def test_the_generated_pages_are_up_to_date(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(DOCS / "gen_reference.py"), "--out", str(tmp_path)],
                            cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    stale = [page for page in gen_reference.PAGES
             if not (DOCS / page).exists()
             or (DOCS / page).read_text(encoding="utf-8") != (tmp_path / page).read_text(encoding="utf-8")]
    assert stale == [], f"out of date with the code: {', '.join(stale)}; run `{GENERATE}` and commit what it writes"


def test_the_reference_holds_only_generated_pages() -> None:
    written = {Path(p) for p in gen_reference.PAGES if p.startswith("reference/")} | {Path("reference/index.md")}
    present = {p.relative_to(DOCS) for p in (DOCS / "reference").iterdir()}
    assert present == written, f"docs/reference/ is written by `{GENERATE}`: remove {sorted(present - written)}"


def test_a_new_flag_changes_the_command_line_page(monkeypatch: pytest.MonkeyPatch) -> None:
    """What makes the up-to-date test fail when a flag is added without regenerating."""
    from refgen import cli

    import supervisor.cli as package

    build = package._parser

    def with_a_new_flag():  # type: ignore[no-untyped-def]
        parser = build()
        cli._subcommands(parser)["status"].add_argument("--brand-new-flag", help="a flag nobody documented")
        return parser

    before = cli.render()
    monkeypatch.setattr(package, "_parser", with_a_new_flag)
    after = cli.render()
    assert after != before and "`--brand-new-flag BRAND_NEW_FLAG`" in after and "a flag nobody documented" in after


def test_every_verb_and_spec_field_is_in_the_reference() -> None:
    from refgen import cli

    from supervisor.spec.model import JobSpec

    page = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    for verb in cli._subcommands(cli._parser()):
        assert f"## `supervise {verb}`" in page, verb
    spec_page = (DOCS / "reference" / "spec.md").read_text(encoding="utf-8")
    for name in set(JobSpec.model_fields) - {"spec_path", "shard_index"}:
        assert f"| `{name}` |" in spec_page, name


def test_the_readme_is_a_front_page() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    # The two commands, exactly: the main job, and the test suite as CI runs it.
    assert ("python3 -m venv .venv && .venv/bin/pip install --require-hashes -r requirements/run.lock && "
            ".venv/bin/pip install --no-deps -e . && .venv/bin/supervise start extract --follow") in readme
    assert "bash .ci/run" in readme
    synopsis = readme[readme.index("## Using it"):]
    synopsis = synopsis[:synopsis.index("```\n", synopsis.index("```sh") + 5)]
    for shown in ("supervise web", "--shards N", "supervise start", "supervise status", "supervise logs"):
        assert shown in synopsis, shown


def test_the_job_requirements_say_what_command_one_does() -> None:
    text = (REPO / "jobs" / "requirements.txt").read_text(encoding="utf-8")
    assert "DESIGN.md" not in text and "never install" not in text.lower()
    for mentioned in re.findall(r"docs/[\w/.-]+\.md", text):
        assert (REPO / mentioned).exists(), mentioned


def test_every_job_spec_the_docs_show_validates(tmp_path: Path) -> None:
    from supervisor.spec.model import find_spec

    pages = [REPO / "README.md", *(p for p in DOCS.rglob("*.md") if p.relative_to(DOCS).parts[0] not in
                                   ("reference", "results"))]
    shown = 0
    for page in pages:
        for n, block in enumerate(re.findall(r"```toml\n(.*?)```", page.read_text(encoding="utf-8"), re.S)):
            if "command" not in block or "[[probes]]" in block:
                continue  # a config file, a pipeline or a probe pack
            spec = tmp_path / f"{page.stem}-{n}.toml"
            spec.write_text(block, encoding="utf-8")
            find_spec(str(spec))  # a SpecError names the file and the field
            shown += 1
    assert shown >= 5
