#!/usr/bin/env python3
"""Checks every relative link of the user documentation: README.md, docs/*.md, bench/README.md,
examples/*/README.md, clients/*/README.md.

A link resolves when the file (or directory) it names exists and, for a `#anchor`, when the
target Markdown file has a heading with that anchor under GitHub's rules: the heading's text
without its Markdown markup, lowercased, every character that is not a letter, a digit, `_`,
`-` or a space dropped, spaces turned into `-`, and `-1`, `-2`, ... appended to repeats.
Links with a scheme (https:, mailto:) are not checked. Fenced code blocks and code spans are
skipped. Prints each broken link as `file:line: target: why` and exits 1 if there is any.

Standard library only: `python3 scripts/check-links.py` from anywhere in the repository.
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(\S+)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def documents():
    """The files whose links are checked, relative to the repository root."""
    files = ["README.md", os.path.join("bench", "README.md")]
    docs = os.path.join(ROOT, "docs")
    files += sorted(os.path.join("docs", f) for f in os.listdir(docs) if f.endswith(".md"))
    examples = os.path.join(ROOT, "examples")
    if os.path.isdir(examples):
        files += sorted(os.path.join("examples", d, "README.md") for d in os.listdir(examples))
    clients = os.path.join(ROOT, "clients")
    if os.path.isdir(clients):
        files += sorted(os.path.join("clients", d, "README.md") for d in os.listdir(clients))
    return [f for f in files if os.path.isfile(os.path.join(ROOT, f))]


def prose_lines(text):
    """(line number, line) of every line outside fenced code blocks."""
    fenced = None
    for number, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if m:
            if fenced is None:
                fenced = m.group(1)
            elif m.group(1) == fenced:
                fenced = None
            continue
        if fenced is None:
            yield number, line


def heading_text(raw):
    """A heading's text as GitHub renders it: links by their text, no code or emphasis marks."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    text = re.sub(r"<[^>]+>", "", text)
    text = text.replace("`", "")
    text = re.sub(r"(\*+|(?<!\w)_+|_+(?!\w))", "", text)
    return text


def slug(text):
    text = heading_text(text).strip().lower()
    kept = "".join(c for c in text if c.isalnum() or c in "_- ")
    return kept.replace(" ", "-")


_anchors = {}


def anchors(path):
    """Every anchor GitHub gives the headings of the Markdown file at `path`."""
    if path not in _anchors:
        seen = {}
        found = set()
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for _, line in prose_lines(text):
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            n = seen.get(base, 0)
            found.add(base if n == 0 else f"{base}-{n}")
            seen[base] = n + 1
        _anchors[path] = found
    return _anchors[path]


def check_target(source, target):
    """None when `target`, a link in the file `source`, resolves; else why not."""
    if target.startswith("<") and target.endswith(">"):
        target = target[1:-1]
    if SCHEME.match(target) or target.startswith("//"):
        return None
    path, _, anchor = target.partition("#")
    if path:
        if path.startswith("/"):
            return "absolute paths do not resolve on every host; link relative to the file"
        resolved = os.path.normpath(os.path.join(os.path.dirname(source), path))
        if not os.path.exists(resolved):
            return "no such file"
        if not resolved.startswith(ROOT + os.sep):
            return "outside the repository"
    else:
        resolved = source
    if anchor:
        if os.path.isdir(resolved) or not resolved.endswith(".md"):
            return "an anchor in a file that is not Markdown"
        if anchor not in anchors(resolved):
            return f"no heading with the anchor #{anchor} in {os.path.relpath(resolved, ROOT)}"
    return None


def main():
    broken = 0
    checked = 0
    for rel in documents():
        source = os.path.join(ROOT, rel)
        with open(source, encoding="utf-8") as f:
            text = f.read()
        for number, line in prose_lines(text):
            line = CODE_SPAN.sub("", line)
            targets = [m.group(1) for m in INLINE_LINK.finditer(line)]
            m = REF_DEF.match(line)
            if m:
                targets.append(m.group(1))
            for target in targets:
                checked += 1
                why = check_target(source, target)
                if why:
                    broken += 1
                    print(f"{rel}:{number}: {target}: {why}")
    if broken:
        print(f"check-links: {broken} of {checked} links are broken", file=sys.stderr)
        return 1
    print(f"check-links: {checked} links in {len(documents())} files resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main())
