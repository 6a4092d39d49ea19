#!/usr/bin/env python3
"""Checks that imports in src/ flow one way (docs/architecture.md): a file names only its own
layer or those below it. Reads every `crate::<layer>` path (and each name of a `crate::{…}`
group) outside test code, and prints each import that climbs and is not one of the known
exceptions below. Exit status 1 when there is one; run from anywhere."""

import pathlib
import re
import sys

# Top to bottom. lib.rs and load.rs are the entry, above everything.
LAYERS = ["command", "hooks", "upkeep", "sets", "db", "cluster", "filter", "config", "server", "model"]

# Imports that climb on purpose, each with its reason (docs/architecture.md, "Known climbs").
KNOWN = {}

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "src"


def layer_of(path):
    rel = path.relative_to(SRC).parts
    return None if len(rel) == 1 else rel[0]


def without_tests(text):
    """The text before a `#[cfg(test)]` item (the module's tests sit at its end)."""
    cut = text.find("#[cfg(test)]")
    return text if cut < 0 else text[:cut]


def named_layers(text):
    text = re.sub(r"//.*", "", text)
    names = set(re.findall(r"crate::([a-z_]+)", text))
    for group in re.findall(r"crate::\{(.*?)\};", text, re.S):
        names.update(re.findall(r"(?:^|,)\s*([a-z_]+)", group))
    return names & set(LAYERS)


def main():
    climbs = []
    for path in sorted(SRC.rglob("*.rs")):
        here = layer_of(path)
        if here is None or path.name.endswith("_tests.rs") or path.name == "tests.rs":
            continue
        for there in named_layers(without_tests(path.read_text())):
            rel = str(path.relative_to(ROOT))
            if LAYERS.index(there) < LAYERS.index(here) and (rel, there) not in KNOWN:
                climbs.append(f"{rel}: {here}/ names {there}/, a layer above it")
    for c in climbs:
        print(c)
    top = sorted(p.name for p in SRC.iterdir())
    if len(top) > 12:
        print(f"src/ holds {len(top)} entries (at most 12): {' '.join(top)}")
        return 1
    return 1 if climbs else 0


if __name__ == "__main__":
    sys.exit(main())
