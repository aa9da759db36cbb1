"""The docs point at things that exist: every relative link and image path in README.md,
ARCHITECTURE.md and docs/*.md names a file (and, for a Markdown file with ``#anchor``, one of
its headings); every ``make`` target and every ``python -m workbench`` flag the README names
exists, the flags read from the argparse parser the CLI's ``main`` builds."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
from pathlib import Path

import pytest

from workbench import cli

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
PAGES = [README, REPO / "ARCHITECTURE.md", *sorted((REPO / "docs").glob("*.md"))]

FENCE = re.compile(r"^```.*?^```", re.M | re.S)
SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
IMG_TAG = re.compile(r"<img\s[^>]*src=\"([^\"]+)\"")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
COMMAND = re.compile(r"-m workbench (\w[\w-]*)")
FLAG = re.compile(r"(?<![\w-])--[a-z][\w-]*")
MAKE = re.compile(r"(?<![\w.-])make ([a-z][\w-]*)")
# Code that runs another program: its flags are not the workbench's.
OTHER_PROGRAM = re.compile(r"^\s*(make|pip|\S*/pip|python -m venv|\S*papermill|\S*jupytext|"
                           r"scripts/|\S*jupyter)\b")


def prose(text: str) -> str:
    """The Markdown outside fenced code and inline code spans (links inside code are text)."""
    return SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, lower case, punctuation dropped."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for h in HEADING.findall(FENCE.sub("", page.read_text())):
        base = slug(h)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[str]:
    text = prose(page.read_text())
    return LINK.findall(text) + IMG_TAG.findall(text)


def broken_links(page: Path) -> list[str]:
    return broken_links_outside(page, REPO)


def broken_links_outside(page: Path, root: Path) -> list[str]:
    """The links of ``page`` that name no file or no heading (paths relative to ``root``)."""
    bad = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, frag = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target} (no such file)")
        elif frag and dest.suffix == ".md" and frag not in anchors(dest):
            bad.append(f"{target} (no heading #{frag} in {dest.relative_to(root)})")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_image_exists(page):
    assert page.is_file(), page
    assert broken_links(page) == []


def test_the_pages_are_checked_and_the_checker_sees_a_bad_link(tmp_path):
    assert {"README.md", "ARCHITECTURE.md"} <= {p.name for p in PAGES}
    assert len(PAGES) > 3, "docs/*.md not found"
    assert any(t.endswith(".png") for t in links(README)), "the README's figure"
    page = tmp_path / "p.md"
    page.write_text("# A `title`, here\n[ok](p.md#a-title-here) ![no](fig.png) "
                    "[bad anchor](p.md#nope) `[in code](x.md)` [web](https://x.y/z)\n")
    assert [b.replace(str(tmp_path), "T") for b in broken_links_outside(page, tmp_path)] == [
        "fig.png (no such file)", "p.md#nope (no heading #nope in p.md)"]


# ---------------------------------------------------------------------------- make --

def makefile_targets() -> set[str]:
    out = set()
    for line in (REPO / "Makefile").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.%-][A-Za-z0-9_.% -]*?)\s*:(?![=:])", line)
        if m and not line.startswith((".", "\t")):
            out |= set(m.group(1).split())
    return out


def code_chunks(text: str) -> list[str]:
    """Each inline code span, and each logical line of each fenced block (``\\`` joined)."""
    chunks = SPAN.findall(FENCE.sub("", text))
    for block in FENCE.findall(text):
        body = "\n".join(block.splitlines()[1:-1]).replace("\\\n", " ")
        chunks += body.splitlines()
    return chunks


def test_every_make_target_the_readme_names_exists():
    named = {m for chunk in code_chunks(README.read_text()) for m in MAKE.findall(chunk)}
    assert {"figures", "test"} <= named  # the walk sees the quick start
    assert sorted(named - makefile_targets()) == []


# ----------------------------------------------------------------------------- CLI --

@pytest.fixture(scope="module")
def commands() -> dict[str, set[str]]:
    """Each subcommand's option strings, from the parser ``cli.main`` parses with
    (``cli.build_parser``). A subcommand that adds its arguments only once chosen gets them
    the way ``--help`` does: chosen, it adds them, prints its help and exits."""
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = {}
    for name, p in sub.choices.items():
        with contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit):
            p.parse_known_args(["--help"])
        out[name] = {s for a in p._actions for s in a.option_strings}
    return out


def flag_uses(text: str) -> list[tuple[str | None, str]]:
    """(command, flag) for every workbench flag the text names in code: a chunk that runs
    ``python -m workbench CMD`` names CMD's flags; a bare ``--flag`` chunk belongs to the last
    command named in its paragraph (None: no command there); other programs' chunks are
    skipped."""
    uses = []
    paragraphs = re.split(r"\n\s*\n", FENCE.sub(lambda m: "\n\n" + m.group(0) + "\n\n", text))
    for para in paragraphs:
        context = None
        for chunk in code_chunks(para) if para.lstrip().startswith("```") else \
                SPAN.findall(para):
            if m := COMMAND.search(chunk):
                context = m.group(1)
                uses += [(context, f) for f in FLAG.findall(chunk[m.end():])]
            elif OTHER_PROGRAM.match(chunk):
                continue
            else:
                uses += [(context, f) for f in FLAG.findall(chunk)]
    return uses


def test_every_cli_flag_the_readme_names_exists(commands):
    uses = flag_uses(README.read_text())
    assert ("run", "--knob") in uses and ("run", "--out") in uses  # the walk sees the examples
    any_command = set().union(*commands.values())
    missing = sorted({f"{cmd or 'any command'}: {flag}" for cmd, flag in uses
                      if (cmd not in commands if cmd else False)
                      or flag not in (commands.get(cmd) if cmd else any_command)})
    assert missing == []


def test_every_command_the_readme_runs_exists(commands):
    named = {m for chunk in code_chunks(README.read_text()) for m in COMMAND.findall(chunk)}
    assert {"run", "sweep", "plan"} <= named
    assert sorted(named - set(commands)) == []


def test_flag_uses_reads_commands_and_bare_flags():
    text = ("Run `python -m workbench run --out D --knob a=b` or `--prompts 4`; "
            "`make figures PIP_EXTRA=\"--extra-index-url U\"`.\n\n`--lonely`\n\n"
            "```bash\npython -m workbench sweep --grid smoke \\\n    --restart\n```\n")
    assert flag_uses(text) == [("run", "--out"), ("run", "--knob"), ("run", "--prompts"),
                               (None, "--lonely"), ("sweep", "--grid"), ("sweep", "--restart")]
