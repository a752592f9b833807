#!/usr/bin/env python3
"""The documentation site, built and opened in a real browser (ctest
label docs; alone: python3 test/docs_site.py; needs the packages mkdocs
and chromium of scripts/lib.sh).

  1. `make docs` builds it (mkdocs --strict: a warning, such as a link to
     a page that is not there, fails the build);
  2. every heading of every page has the id GitHub gives it (the ids
     test/docs_links.py checks links against), so one link works in both,
     and every table and fenced code block of a page is one on the site;
  3. the site's Markdown reads lists as GitHub does: its fixture
     (test/docs/fixtures/lists.md), rendered with mkdocs.yml's
     extensions, is test/docs/lists.html;
  4. the browser check itself finds a broken image (its fixture,
     test/docs/fixtures/broken-image.html);
  5. in headless Chromium, the home page, the SQL reference's page (the
     first page of docs/ until there is one) and every page with an image:
     each has its title and main content, its nav lists every page of the
     nav (mkdocs.yml), each image loads, and nothing is fetched from
     another origin (Chromium cannot resolve any host name but loopback).

The site is served by a server of this process's own (http.server on a
port of 127.0.0.1 the kernel picks, stopped at the end); Chromium runs
with a profile of its own in a temporary directory, its process group
ended by its id after at most 120 s. Prints an "ok"/"not ok" line per
check, then "N passed, N failed"; exits 1 when one failed.
"""

import difflib
import functools
import html
import html.parser
import json
import os
import posixpath
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "scripts", "docs"))
sys.path.insert(0, os.path.join(ROOT, "test"))
import mdlinks  # noqa: E402
import docs_nav  # noqa: E402

SITE = os.path.join(ROOT, "build", "docs")
STAGED = os.path.join(ROOT, "build", "docs-src")
CHROMIUM_SECONDS = 120


class Tap:
    def __init__(self):
        self.n = 0
        self.failed = 0

    def check(self, what, problems):
        """problems: a list of strings, empty when the check passed."""
        self.n += 1
        if problems:
            self.failed += 1
            print("not ok %d - %s" % (self.n, what))
            for p in problems[:40]:
                for line in str(p).split("\n"):
                    print("# " + line)
            if len(problems) > 40:
                print("# ... and %d more" % (len(problems) - 40))
        else:
            print("ok %d - %s" % (self.n, what))
        sys.stdout.flush()

    def finish(self):
        print("%d passed, %d failed" % (self.n - self.failed, self.failed))
        return 1 if self.failed else 0


def build():
    r = subprocess.run(["make", "-s", "docs"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        return ["make docs exited %d" % r.returncode] + (r.stdout + r.stderr).strip().split("\n")
    return []


class HeadingIds(html.parser.HTMLParser):
    """The ids of a built page's headings in its main content (<div
    role="main">: not the theme's dialogs), in order, and how many tables
    and code blocks it has."""

    def __init__(self):
        super().__init__()
        self.ids = []
        self.tables = 0
        self.pres = 0
        self.depth = 0  # of <div> inside the main content; 0: outside

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "div":
            if self.depth:
                self.depth += 1
            elif a.get("role") == "main":
                self.depth = 1
        elif self.depth and re.fullmatch(r"h[1-6]", tag) and "id" in a:
            self.ids.append(a["id"])
        elif self.depth and tag == "table":
            self.tables += 1
        elif self.depth and tag == "pre":
            self.pres += 1

    def handle_endtag(self, tag):
        if tag == "div" and self.depth:
            self.depth -= 1


def staged_pages():
    pages = []
    for d, _, names in os.walk(STAGED):
        for name in names:
            if name.endswith(".md"):
                pages.append(os.path.relpath(os.path.join(d, name), STAGED).replace(os.sep, "/"))
    return sorted(pages)


def html_name(page):
    """The built page of a staged Markdown page: NAME.html, and a README.md
    is its directory's index.html (mkdocs' rule, where no index.md is)."""
    d, name = posixpath.split(page)
    if name == "README.md" and not os.path.exists(os.path.join(STAGED, d, "index.md")):
        return posixpath.join(d, "index.html")
    return page[:-3] + ".html"


TABLE_DELIMITER = re.compile(r"^ *\|?( *:?-+:? *\|)+( *:?-+:? *)?$")


def blocks(text):
    """How many tables (their delimiter rows) and fenced code blocks a
    Markdown text has, outside fences."""
    lines = text.split("\n")
    openings = []
    code = mdlinks.fenced(lines, openings)
    tables = sum(1 for line, c in zip(lines, code) if not c and TABLE_DELIMITER.match(line))
    fences = len(openings)
    return tables, fences


def heading_ids():
    problems = []
    for page in staged_pages():
        with open(os.path.join(STAGED, page), encoding="utf-8") as f:
            text = f.read()
        want = [h[3] for h in mdlinks.headings(text) if h[3]]
        tables, fences = blocks(text)
        built = os.path.join(SITE, html_name(page))
        if not os.path.exists(built):
            problems.append("%s: no %s" % (page, os.path.relpath(built, ROOT)))
            continue
        p = HeadingIds()
        with open(built, encoding="utf-8") as f:
            p.feed(f.read())
        if p.ids != want:
            extra = [i for i in p.ids if i not in want]
            missing = [i for i in want if i not in p.ids]
            problems.append("%s: the site's ids differ from GitHub's: only on the site %s, only on GitHub %s"
                            % (page, extra[:5], missing[:5]))
        if p.tables != tables:
            problems.append("%s: %d tables on the site, %d in the Markdown" % (page, p.tables, tables))
        if p.pres < fences:
            problems.append("%s: %d code blocks on the site, %d fences in the Markdown" % (page, p.pres, fences))
    return problems


RENDER = """
import sys
sys.path.insert(0, "scripts/docs")
import markdown
from mkdocs.config import load_config
config = load_config("mkdocs.yml")
md = markdown.Markdown(extensions=config["markdown_extensions"], extension_configs=config["mdx_configs"])
with open(sys.argv[1], encoding="utf-8") as f:
    sys.stdout.write(md.convert(f.read()) + "\\n")
"""


def lists():
    """Differences between the fixture of lists rendered as the site
    renders pages and the HTML expected (by mkdocs' own Python)."""
    if not shutil.which("mkdocs"):
        return ["no mkdocs: scripts/lib.sh's ensure_packages installs it"]
    with open(shutil.which("mkdocs"), encoding="utf-8", errors="replace") as f:
        python = f.readline()[2:].strip().split()[0]
    r = subprocess.run([python, "-c", RENDER, "test/docs/fixtures/lists.md"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return ["rendering the fixture failed:"] + r.stderr.strip().split("\n")
    with open(os.path.join(ROOT, "test", "docs", "lists.html"), encoding="utf-8") as f:
        want = f.read()
    return list(difflib.unified_diff(want.split("\n"), r.stdout.split("\n"), "test/docs/lists.html",
                                     "rendered", lineterm=""))


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def serve(directory):
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=directory))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


def chromium(url, profile):
    """The DOM of url after its scripts, from headless Chromium."""
    cmd = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--no-first-run", "--no-default-browser-check", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--disable-extensions",
           "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
           "--user-data-dir=" + profile, "--window-size=1280,1024",
           "--virtual-time-budget=60000", "--dump-dom", url]
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except FileNotFoundError:
        raise RuntimeError("no chromium: scripts/lib.sh's ensure_packages installs it")
    try:
        out, err = proc.communicate(timeout=CHROMIUM_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise RuntimeError("chromium did not finish within %d s" % CHROMIUM_SECONDS)
    finally:
        # Whatever Chromium left behind in its process group (this group is
        # its own: start_new_session).
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    m = re.search(r'<pre id="result">(.*?)</pre>', out.decode("utf-8", "replace"), re.S)
    if not m or m.group(1) == "pending":
        raise RuntimeError("the check page wrote no result (chromium exited %d): %s"
                           % (proc.returncode, err.decode("utf-8", "replace")[-2000:]))
    return json.loads(html.unescape(m.group(1)))


def browse(base, pages, profile):
    url = "http://%s:%d/check.html?pages=%s" % (base[0], base[1], ",".join(pages))
    return chromium(url, profile)


def page_problems(name, r, nav_want):
    if "error" in r:
        return ["%s: %s" % (name, r["error"])]
    p = []
    if "pg_outbox" not in r["title"]:
        p.append("%s: title %r does not name the site" % (name, r["title"]))
    if not r["h1"].strip():
        p.append("%s: no heading" % name)
    if r["main"] < 200:
        p.append("%s: main content of %d characters" % (name, r["main"]))
    nav = [n[len("/site/"):] if n.startswith("/site/") else n for n in r["nav"]]
    if nav_want is not None and nav != nav_want:
        p.append("%s: the nav lists %s, not the pages %s" % (name, nav, nav_want))
    for b in r["broken"]:
        p.append("%s: image %s did not load" % (name, b))
    for f in r["foreign"]:
        p.append("%s: fetches %s from another origin" % (name, f))
    return p


def main():
    tap = Tap()
    problems = build()
    tap.check("make docs builds the site, mkdocs --strict", problems)
    if problems:
        return tap.finish()
    tap.check("every heading of the site has GitHub's id, every table and fence is one", heading_ids())
    tap.check("the site's Markdown reads lists, fences in them and numbers as GitHub does", lists())

    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as f:
        nav_pages = docs_nav.nav_pages(f.read())
    nav_want = [p[:-3] + ".html" for p in nav_pages]
    reference = "sql-reference.html" if "sql-reference.md" in nav_pages else \
        next((p for p in nav_want if p not in ("index.html", "CHANGELOG.html", "CONTRIBUTING.html")), None)
    with_images = []
    for d, _, names in os.walk(SITE):
        for name in names:
            if name.endswith(".html"):
                path = os.path.join(d, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    if "<img" in f.read():
                        with_images.append(os.path.relpath(path, SITE).replace(os.sep, "/"))
    pages = ["index.html"] + ([reference] if reference else []) + sorted(set(with_images) - {"index.html", reference})

    tmp = tempfile.mkdtemp(prefix="pg_outbox-docs-site-")
    server = None
    try:
        os.symlink(SITE, os.path.join(tmp, "site"))
        os.symlink(os.path.join(ROOT, "test", "docs", "fixtures"), os.path.join(tmp, "fixtures"))
        shutil.copyfile(os.path.join(ROOT, "test", "docs", "check.html"), os.path.join(tmp, "check.html"))
        server, thread = serve(tmp)
        base = server.server_address

        try:
            r = browse(base, ["fixtures/broken-image.html"], os.path.join(tmp, "profile-fixture"))
            r = r.get("fixtures/broken-image.html", {})
            got = r.get("broken")
            problems = [] if got == ["no-such-picture.png"] and r.get("images") == 2 else \
                ["the fixture's broken images: got %r, want ['no-such-picture.png'] of 2 images (%r)" % (got, r)]
        except RuntimeError as e:
            problems = [str(e)]
        tap.check("the browser check finds a broken image and only it", problems)

        try:
            results = browse(base, ["site/" + p for p in pages], os.path.join(tmp, "profile-site"))
            problems = []
            for p in pages:
                r = results.get("site/" + p, {"error": "not checked"})
                problems += page_problems(p, r, nav_want if p in ("index.html", reference) else None)
        except RuntimeError as e:
            problems = [str(e)]
        tap.check("in Chromium, %s: title, content, a nav of every page, images, nothing from another origin"
                  % ", ".join(pages), problems)
    finally:
        if server:
            server.shutdown()
            server.server_close()
        shutil.rmtree(tmp, ignore_errors=True)
    return tap.finish()


if __name__ == "__main__":
    sys.exit(main())
