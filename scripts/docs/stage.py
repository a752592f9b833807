#!/usr/bin/env python3
"""Stages the site's Markdown for mkdocs (mkdocs.yml's docs_dir).

Usage: scripts/docs/stage.py [--root DIR] [--out DIR] [--list]
(make docs runs it; --list only prints the pages, staging nothing)

The site's pages are the repository's own files, never copies kept by
hand: README.md as the home page (index.md), every docs/**/*.md at its
path under docs/, and CONTRIBUTING.md and CHANGELOG.md where they exist.
Each is copied into OUT (build/docs-src, emptied first) with its relative
links rewritten for its place in the site: README's docs/relay.md becomes
relay.md, a page's ../README.md#x index.md#x. A link to a file or
directory that is no page (bench/results/..., examples/python/,
relay/systemd/relay.env) is copied into the site under source/ at its
repository path (a directory as its README.md, or a page listing its
files; a file of docs/ that is no page, such as an image, at its place
beside the pages), so the site keeps working offline; Markdown copied so
is rendered too, its own links rewritten the same way, but is not in the
nav. A link in raw HTML to a
page gets the page's .html name (mkdocs.yml: use_directory_urls: false).
A link to nothing is left as written: the link checker
(test/docs_links.py) names it and mkdocs --strict fails on it.

Prints the site's pages (not those under source/), one per line.
"""

import argparse
import os
import posixpath
import shutil
import sys
from urllib.parse import quote, unquote

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mdlinks  # noqa: E402

SOURCE = "source/"


def site_pages(files):
    """{repository path: site path} of the site's pages."""
    pages = {}
    if "README.md" in files:
        pages["README.md"] = "index.md"
    for f in sorted(files):
        if f.startswith("docs/") and f.endswith(".md"):
            pages[f] = f[len("docs/"):]
    for f in ("CONTRIBUTING.md", "CHANGELOG.md"):
        if f in files:
            pages[f] = f
    taken = {}
    for repo, site in pages.items():
        if site.lower() in taken:
            raise SystemExit("stage.py: %s and %s would both be the site's %s" % (taken[site.lower()], repo, site))
        taken[site.lower()] = repo
    return pages


class Stager:
    def __init__(self, root, out):
        self.root = root
        self.out = out
        self.files = mdlinks.repo_files(root)
        self.dirs = mdlinks.directories(self.files)
        self.pages = site_pages(self.files)
        self.staged = dict(self.pages)  # repository path -> site path
        self.queue = list(self.pages)
        self.listings = {}  # repository path -> text of a directory's listing

    def site_path(self, target):
        """The site path of a repository file, staged (queued) when new."""
        if target not in self.staged:
            # A file of docs/ (an image) keeps its place beside the pages.
            inside = target.startswith("docs/") and not target.endswith(".md")
            self.staged[target] = target[len("docs/"):] if inside else SOURCE + target
            self.queue.append(target)
        return self.staged[target]

    def directory(self, d):
        """The file a link to directory d of the repository leads to: its
        README.md, else a page listing its files (staged as
        source/D/index.md, from a Markdown file of its own that stands
        for it here: its files linked, its subdirectories named)."""
        readme = "README.md" if d == "." else d + "/README.md"
        if readme in self.files:
            return readme
        listing = d + "/index.md"
        if listing in self.files:
            return listing
        if listing not in self.staged:
            names = sorted({f[len(d) + 1:].split("/")[0] for f in self.files if f.startswith(d + "/")})
            lines = ["# %s/" % d, "", "The files of the directory %s/ of the source tree." % d, ""]
            for name in names:
                if d + "/" + name in self.files:
                    lines.append("- [%s](%s)" % (name, quote(name, safe="/-_.~")))
                else:
                    lines.append("- %s/" % name)
            self.listings[listing] = "\n".join(lines) + "\n"
            self.staged[listing] = SOURCE + listing
            self.queue.append(listing)
        return listing

    def rewrite(self, src, link):
        url = link.url
        if not url or url.startswith("#") or mdlinks.is_external(url) or url.startswith("/"):
            return url
        path, hash_, fragment = url.partition("#")
        path = path.partition("?")[0]
        target = posixpath.normpath(posixpath.join(posixpath.dirname(src), unquote(path)))
        if target in self.dirs or target == ".":
            target = self.directory(target)
        elif target not in self.files:
            return url
        site_target = self.site_path(target)
        here = posixpath.dirname(self.staged[src]) or "."
        rel = posixpath.relpath(site_target, here)
        if link.kind == "html" and rel.endswith(".md"):
            rel = rel[:-3] + ".html"
        return quote(rel, safe="/-_.~") + hash_ + fragment

    def stage(self, src):
        dest = os.path.join(self.out, self.staged[src])
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        if src in self.listings:
            text = self.listings[src]
        elif not src.endswith(".md"):
            shutil.copyfile(os.path.join(self.root, src), dest)
            return
        else:
            text = self.read(src)
        links, _ = mdlinks.scan(text)
        lines = text.split("\n")
        for link in sorted(links, key=lambda k: (k.line, k.start), reverse=True):
            new = self.rewrite(src, link)
            if new != link.url:
                line = lines[link.line - 1]
                lines[link.line - 1] = line[:link.start] + new + line[link.end:]
        with open(dest, "w", encoding="utf-8") as f:
            f.write("\n".join(lines))

    def read(self, src):
        try:
            with open(os.path.join(self.root, src), encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError as e:
            raise SystemExit("stage.py: %s is not UTF-8 (%s)" % (src, e))
        return text

    def run(self):
        if os.path.isdir(self.out):
            shutil.rmtree(self.out)
        os.makedirs(self.out)
        while self.queue:
            self.stage(self.queue.pop(0))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(here, "..", ".."))
    ap.add_argument("--out", default=None)
    ap.add_argument("--list", action="store_true", help="print the pages, stage nothing")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    out = os.path.abspath(args.out or os.path.join(root, "build", "docs-src"))
    stager = Stager(root, out)
    if not args.list:
        stager.run()
    for site in sorted(stager.pages.values()):
        print(site)
    return 0


if __name__ == "__main__":
    sys.exit(main())
