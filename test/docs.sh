#!/usr/bin/env bash
# The documentation's links, fast and without building anything (ctest
# label docs; run it alone with `bash test/docs.sh`):
#  1. the link checker (test/docs_links.py) on its fixtures
#     (test/docs/fixtures/) reports exactly the broken links planted there
#     (test/docs/expected.txt): a missing file, a missing anchor, a third
#     of three repeated headings, an id spelt the way mkdocs' default
#     would, an undefined reference, an absolute path, a missing image, a
#     reference definition to nothing, a link whose text spans two lines,
#     a file that is not UTF-8, a path out of the tree; and none of the
#     good ones (headings with code and punctuation, a repeated heading, a
#     title, a query, a directory, links in code, comments and fences);
#  2. every Markdown file of the repository has no broken relative link
#     (README.md, CONTRIBUTING.md, CHANGELOG.md, docs/, examples/, bench/);
#  3. the site's nav (mkdocs.yml) names every page of docs/ and nothing
#     else (test/docs_nav.py), and fails for a page that is not in it.
# The site itself (mkdocs build --strict, in a browser) is test/docs_site.py.
# Prints an "ok"/"not ok" line per check, then "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
. test/ops/tap.bash

# Runs a command; on failure shows its output as comment lines.
quiet() {
	local out rc=0
	out=$("$@" 2>&1) || rc=$?
	[ "$rc" -eq 0 ] || sed 's/^/# /' <<<"$out" >&2
	return "$rc"
}

fixtures_report_what_was_planted() {
	diff -u test/docs/expected.txt <(python3 test/docs_links.py --root test/docs/fixtures page.md other.md not-utf8.md)
}
check "the link checker reports exactly the broken links planted in its fixtures" quiet fixtures_report_what_was_planted

check "no Markdown file of the repository has a broken relative link" quiet python3 test/docs_links.py

nav_has_every_page() {
	python3 scripts/docs/stage.py --list | python3 test/docs_nav.py mkdocs.yml
}
check "the site's nav names every page and no other" quiet nav_has_every_page

nav_check_finds_a_missing_page() {
	! { python3 scripts/docs/stage.py --list; echo a-page-not-in-the-nav.md; } | python3 test/docs_nav.py mkdocs.yml >/dev/null
}
check "the nav check fails for a page that is not in the nav" nav_check_finds_a_missing_page

finish
