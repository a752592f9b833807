#!/usr/bin/env python3
"""Checks the relative links of the repository's Markdown files.

Usage: test/docs_links.py [--root DIR] [FILE.md ...]

Without files: every *.md of the repository that git tracks (or, outside a
git work tree, every *.md under DIR), but those under build/,
node_modules/ and test/docs/ (the checker's own fixtures, whose broken
links are planted). Each relative link, [text](path), [text](path#id),
[text](#id), <a href="path">, <img src="path"> and reference definition
[label]: path, must name a file or directory of the repository, and an
#id in a Markdown file must be the id of one of its headings (GitHub's
ids, which the site's Markdown extension gives its headings too: see
scripts/docs/mdlinks.py) or of an HTML element with that id or name.
[text][label] must have a definition of label. Links in fenced code
blocks, inline code and HTML comments are text, not links; http(s):,
mailto: and other links with a scheme are not followed (no network).

Prints "FILE:LINE: LINK: REASON" for each broken link, then "N passed,
N failed" (links), and exits 1 when one is broken.
"""

import argparse
import os
import sys
from urllib.parse import unquote

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "docs"))
import mdlinks  # noqa: E402

SKIP_DIRS = ("build/", "node_modules/", "test/docs/")


def markdown_files(files):
    return sorted(f for f in files if f.endswith(".md")
                  and not any(f.startswith(s) or ("/" + s) in f for s in SKIP_DIRS))


def read(path):
    """The text of a file, and None or, when it is not UTF-8, a broken
    "link" that says where (the rest is checked, the bad bytes replaced)."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        return data.decode("utf-8", "replace"), (line, "(the file)", "not UTF-8: byte 0x%02x at offset %d"
                                                  % (data[e.start], e.start))


class Checker:
    def __init__(self, root, files):
        self.root = root
        self.files = files
        self.dirs = mdlinks.directories(files)
        self.ids = {}

    def anchors(self, path):
        if path not in self.ids:
            self.ids[path] = mdlinks.anchors(read(os.path.join(self.root, path))[0])
        return self.ids[path]

    def problem(self, src, url):
        """Why a link of file src is broken, or None."""
        if mdlinks.is_external(url):
            return None
        if not url:
            return "empty link"
        path, _, fragment = url.partition("#")
        path = path.partition("?")[0]
        if path.startswith("/"):
            return "absolute path: write it relative to the file"
        if path:
            target = os.path.normpath(os.path.join(os.path.dirname(src), unquote(path))).replace(os.sep, "/")
            if target == ".":
                target = ""
            if target.startswith("../") or target == "..":
                return "outside the repository"
            if target not in self.files and target not in self.dirs and target != "":
                return "no such file"
        else:
            target = src
        if fragment and target in self.files and target.endswith(".md"):
            if unquote(fragment) not in self.anchors(target):
                return "no heading with id \"%s\" in %s" % (unquote(fragment), target)
        return None

    def check(self, src):
        """[(line, url, reason)] for the broken links of src."""
        text, bad = read(os.path.join(self.root, src))
        links, uses = mdlinks.scan(text)
        broken = [bad] if bad else []
        for link in links:
            reason = self.problem(src, link.url)
            if reason:
                broken.append((link.line, link.url, reason))
        labels = mdlinks.ref_labels(text)
        for line, label in uses:
            if mdlinks.normalise_label(label) not in labels:
                broken.append((line, "[%s]" % label, "no definition of this reference"))
        return len(links) + len(uses) + (1 if bad else 0), sorted(broken)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("files", nargs="*")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    files = mdlinks.repo_files(root)
    sources = args.files or markdown_files(files)
    checker = Checker(root, files)
    passed = failed = 0
    for src in sources:
        total, broken = checker.check(src)
        for line, url, reason in broken:
            print("%s:%d: %s: %s" % (src, line, url, reason))
        failed += len(broken)
        passed += total - len(broken)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
