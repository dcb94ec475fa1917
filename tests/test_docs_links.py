"""Every relative link in README.md and docs/*.md resolves: the file it names exists and, for `file#anchor` or
`#anchor`, that file has a heading with that anchor (GitHub's rule). Sections move between pages; a link left
behind would point nowhere. Also: README.md stays a front page (at most 160 lines, the "Where to change what" table
and the code map near the top)."""

import glob
import os
import re

import pytest

from helpers import REPO_ROOT

PAGES = ["README.md"] + sorted(os.path.relpath(path, REPO_ROOT) for path in glob.glob(os.path.join(REPO_ROOT, "docs",
                                                                                                  "*.md")))
README_MAX_LINES = 160
TOP_LINES = 60


def _prose(text: str) -> str:
    """`text` without fenced and indented code blocks and inline code spans, where `[x](y)` and `# x` are not
    markdown (a Python comment in a code block is no heading; `signatures[...](x)` is no link)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    lines, previous_blank_or_code = [], True
    for line in text.split("\n"):
        indented_code = line.startswith("    ") and previous_blank_or_code and not line.lstrip().startswith("- ")
        if indented_code:
            lines.append("")
        else:
            lines.append(line)
        previous_blank_or_code = not line.strip() or indented_code
    return re.sub(r"`[^`]*`", "", "\n".join(lines))


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading's text: lowercase, punctuation dropped except '-' and '_', spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of the page's headings; a repeated heading gets GitHub's `-1`, `-2`, ... suffixes."""
    found, counts = set(), {}
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", _prose(text), flags=re.M):
        base = anchor(heading.replace("`", ""))
        found.add(f"{base}-{counts[base]}" if base in counts else base)
        counts[base] = counts.get(base, 0) + 1
    return found


def links(text: str) -> list[str]:
    """The targets of the page's markdown links and images, `[text](target)` and `![text](target)`."""
    return re.findall(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", _prose(text))


def broken_links(page: str, text: str, root: str = REPO_ROOT) -> list[str]:
    """One line per relative link of `page` (a path under `root`, whose content is `text`) that names a missing file
    or a missing heading anchor; web links (`scheme:`) are not followed."""
    broken = []
    for target in links(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue
        path, _, fragment = target.partition("#")
        file = os.path.normpath(os.path.join(root, os.path.dirname(page), path))
        if path and not os.path.exists(file):
            broken.append(f"{page}: link {target!r}: no file {os.path.relpath(file, root)}; point it at the page "
                          "that holds the section now")
            continue
        if not fragment:
            continue
        headings = anchors(open(file).read() if path else text)
        if fragment not in headings:
            shown = os.path.relpath(file, root) if path else page
            broken.append(f"{page}: link {target!r}: {shown} has no heading with anchor {fragment!r}; use one of "
                          f"{sorted(headings)}")
    return broken


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_resolves_to_a_file_and_heading(page):
    assert not broken_links(page, open(os.path.join(REPO_ROOT, page)).read()), "\n".join(
        broken_links(page, open(os.path.join(REPO_ROOT, page)).read()))


def test_the_check_reports_a_planted_broken_link():
    """Negative control: a missing page, a missing anchor on another page and on this one are each reported; links
    that resolve, web links and link-like text in code are not."""
    run_directory = sorted(anchors(open(os.path.join(REPO_ROOT, "docs", "run_directory.md")).read()))
    text = ("# Here\n\nSee [gone](gone.md), [moved](run_directory.md#no-such-section), [up](#nowhere),\n"
            "[fine](run_directory.md#exit-codes), [self](#here), [web](https://example.com/x.md),\n"
            "`signatures[\"x\"](images=...)` and\n\n    [code](missing.md)\n\n```python\n# [code](missing.md)\n```\n")
    assert broken_links("docs/planted.md", text) == [
        "docs/planted.md: link 'gone.md': no file docs/gone.md; point it at the page that holds the section now",
        f"docs/planted.md: link 'run_directory.md#no-such-section': docs/run_directory.md has no heading with anchor "
        f"'no-such-section'; use one of {run_directory}",
        "docs/planted.md: link '#nowhere': docs/planted.md has no heading with anchor 'nowhere'; use one of ['here']",
    ]


def test_anchors_follow_githubs_rule():
    assert anchor("Run directory (model_dir)") == "run-directory-model_dir"
    assert anchor("What happens when ...") == "what-happens-when-"
    assert anchor("Check your changes: replica invariance") == "check-your-changes-replica-invariance"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}


def test_the_readme_is_a_front_page():
    lines = open(os.path.join(REPO_ROOT, "README.md")).read().splitlines()
    assert len(lines) <= README_MAX_LINES, (f"README.md has {len(lines)} lines, over {README_MAX_LINES}: move a "
                                            "section to a page under docs/ and link it")
    for heading in ("## Where to change what", "## Code map"):
        assert heading in lines, f"README.md has no {heading!r} heading"
        assert lines.index(heading) < TOP_LINES, (f"README.md's {heading!r} is on line {lines.index(heading) + 1}, "
                                                  f"past line {TOP_LINES}: shorten what comes before it")
