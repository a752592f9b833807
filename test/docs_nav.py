#!/usr/bin/env python3
"""Checks that the site's nav (mkdocs.yml) names every page and nothing
else: a page added to docs/ and not to the nav would be built but reached
from no menu (mkdocs only logs that at INFO level, even with --strict).

Usage: scripts/docs/stage.py --list | test/docs_nav.py [mkdocs.yml]

Reads the site's pages (their paths in the site, one per line) on
standard input. Prints "PAGE: not in the nav" and "PAGE: in the nav, no
such page" lines, and exits 1 when there is one.
"""

import re
import sys

ENTRY = re.compile(r"^\s*-\s+(?:[^\n]*?:\s+)?[\"']?([^\s\"':]+\.md)[\"']?\s*$")


def nav_pages(config):
    pages = []
    in_nav = False
    for line in config.split("\n"):
        if re.match(r"^nav:\s*$", line):
            in_nav = True
            continue
        if in_nav and line and not line[0].isspace() and not line.startswith("#"):
            break
        m = ENTRY.match(line) if in_nav else None
        if m:
            pages.append(m.group(1))
    return pages


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "mkdocs.yml"
    with open(path, encoding="utf-8") as f:
        nav = nav_pages(f.read())
    pages = [p.strip() for p in sys.stdin if p.strip()]
    bad = ["%s: not in the nav of %s" % (p, path) for p in pages if p not in nav]
    bad += ["%s: in the nav of %s, no such page" % (p, path) for p in nav if p not in pages]
    bad += ["%s: twice in the nav of %s" % (p, path) for p in sorted(set(nav)) if nav.count(p) > 1]
    for b in bad:
        print(b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
