"""Every relative link in README.md and docs/ points at a file of the
repository, and every #anchor at a heading of its page (GitHub's heading
slugs)."""
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but hyphens and spaces dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: str):
    out, fenced = set(), False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                fenced = not fenced
            elif not fenced and line.startswith("#"):
                out.add(slug(line.lstrip("#")))
    return out


def links(path: str):
    fenced = False
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.startswith("```"):
                fenced = not fenced
                continue
            if not fenced:
                for m in LINK.finditer(line):
                    yield n, m.group(1)


def test_slugs():
    assert slug(" The server (`fairseq-aggressive-bench-serve`)") == "the-server-fairseq-aggressive-bench-serve"
    assert slug("AMX tiles (avx512amx)") == "amx-tiles-avx512amx"
    assert slug("`make demo`") == "make-demo"


def test_every_relative_link_and_anchor_resolves():
    pages = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    broken = []
    for page in pages:
        for n, target in links(page):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = page if not file else os.path.normpath(os.path.join(os.path.dirname(page), file))
            where = f"{os.path.relpath(page, ROOT)}:{n}: {target}"
            if not os.path.exists(dest):
                broken.append(f"{where} (no such file)")
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                broken.append(f"{where} (no such heading)")
    assert not broken, "\n".join(broken)
