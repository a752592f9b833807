"""The links and heading ids of a Markdown file, as GitHub renders it.

Shared by the link checker (test/docs_links.py), the site's staging
(scripts/docs/stage.py) and the site's Markdown extension
(scripts/docs/gfm_ids.py), so that a link checked here is the link the
site gets, and a heading's id is the same on GitHub and on the site.

Only the standard library. Reads Markdown line by line, the way the
documents of this repository are written: fenced code blocks (``` and
~~~, at any indent, inside list items too) and inline code spans hold no
links and no headings; HTML comments hold no links.
"""

import html
import os
import re
import subprocess

FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
REF_DEF = re.compile(r"^ {0,3}\[((?:[^\]\\]|\\.)+)\]:[ \t]*(<[^>]*>|\S+)")
REF_USE = re.compile(r"\]\[((?:[^\]\\]|\\.)+)\]")
HTML_URL = re.compile(r"""\b(?:href|src)\s*=\s*["']([^"']*)["']""", re.I)
HTML_ID = re.compile(r"""<[A-Za-z][^>]*?\b(?:id|name)\s*=\s*["']([^"']+)["']""")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


class Link:
    """A link of a file: its 1-based line, the destination as written, and
    where the destination stands in that line (for rewriting)."""

    def __init__(self, line, url, start, end, kind):
        self.line = line
        self.url = url
        self.start = start
        self.end = end
        self.kind = kind  # "inline", "reference" (a definition), "html"

    def __repr__(self):
        return f"Link({self.line}, {self.url!r}, {self.kind})"


def fenced(lines, openings=None):
    """For each line, whether it belongs to a fenced code block (its fence
    lines included); the index of each block's first line is appended to
    openings when given."""
    out = []
    fence = None
    for i, line in enumerate(lines):
        m = FENCE.match(line)
        if fence is None:
            if m and not (m.group(1)[0] == "`" and "`" in line[m.end():]):
                fence = m.group(1)
                out.append(True)
                if openings is not None:
                    openings.append(i)
            else:
                out.append(False)
        else:
            out.append(True)
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                    and not line[m.end():].strip():
                fence = None
    return out


def code_span(text, i):
    """At a backtick run starting at text[i]: (j, close), j the end of that
    run and close the end of the run of as many backticks that closes the
    code span, or -1 when none does (the run is then literal text)."""
    n = len(text)
    j = i
    while j < n and text[j] == "`":
        j += 1
    k = j
    while k < n:
        if text[k] == "`":
            m = k
            while m < n and text[m] == "`":
                m += 1
            if m - k == j - i:
                return j, m
            k = m
        else:
            k += 1
    return j, -1


def mask_code(line):
    """The text (a line or a paragraph's lines) with its inline code spans
    and backslash escapes blanked (same length, line breaks kept): what is
    left may hold links."""
    chars = list(line)
    i = 0
    n = len(line)
    while i < n:
        c = line[i]
        if c == "\\" and i + 1 < n and line[i + 1] != "\n":
            chars[i] = chars[i + 1] = " "
            i += 2
            continue
        if c == "`":
            j, close = code_span(line, i)
            if close < 0:
                i = j
                continue
            for p in range(i, close):
                if chars[p] != "\n":
                    chars[p] = " "
            i = close
            continue
        i += 1
    return "".join(chars)


def masked_lines(lines, code):
    """Each line with mask_code applied to its paragraph (a run of lines
    that are neither blank nor code): a code span may break across
    lines."""
    out = list(lines)
    start = None
    for i in range(len(lines) + 1):
        inside = i < len(lines) and not code[i] and lines[i].strip()
        if inside and start is None:
            start = i
        elif not inside and start is not None:
            out[start:i] = mask_code("\n".join(lines[start:i])).split("\n")
            start = None
    return out


def _destination(line, masked, pos):
    """Reads a link destination (and optional title) of an inline link
    starting at pos, just after "(": returns (url, start, end) or None when
    no closing ")" follows."""
    n = len(line)
    i = pos
    while i < n and line[i] in " \t":
        i += 1
    if i < n and line[i] == "<":
        j = line.find(">", i + 1)
        if j < 0:
            return None
        start, end = i + 1, j
        i = j + 1
    else:
        start = i
        depth = 0
        while i < n:
            c = line[i]
            if c == "\\":
                i += 2
                continue
            if c in " \t":
                break
            if c == "(":
                depth += 1
            elif c == ")":
                if depth == 0:
                    break
                depth -= 1
            i += 1
        end = min(i, n)
    while i < n and line[i] in " \t":
        i += 1
    if i < n and line[i] in "\"'(":
        close = {"\"": "\"", "'": "'", "(": ")"}[line[i]]
        j = line.find(close, i + 1)
        if j < 0:
            return None
        i = j + 1
        while i < n and line[i] in " \t":
            i += 1
    if i < n and masked[i] == ")":
        return line[start:end], start, end
    return None


def scan(text):
    """The links of a Markdown text (a list of Link) and its reference
    uses: [(line, label)] for each [text][label]."""
    lines = text.split("\n")
    code = fenced(lines)
    masks = masked_lines(lines, code)
    links = []
    uses = []
    in_comment = False
    bracket = False  # a "[" earlier in the paragraph
    for no, (line, is_code) in enumerate(zip(lines, code), 1):
        if is_code:
            bracket = False
            continue
        masked = masks[no - 1]
        # HTML comments, which may span lines.
        chars = list(masked)
        i = 0
        while i < len(masked):
            if in_comment:
                j = masked.find("-->", i)
                stop = len(masked) if j < 0 else j + 3
                for p in range(i, stop):
                    chars[p] = " "
                if j < 0:
                    break
                in_comment = False
                i = stop
            else:
                j = masked.find("<!--", i)
                if j < 0:
                    break
                in_comment = True
                i = j
        masked = "".join(chars)

        m = REF_DEF.match(masked)
        if m:
            dest = line[m.start(2):m.end(2)]
            start = m.start(2)
            if dest.startswith("<"):
                dest = dest[1:-1]
                start += 1
            links.append(Link(no, dest, start, start + len(dest), "reference"))
            continue
        # A link's text may start on an earlier line of its paragraph.
        if not line.strip():
            bracket = False
        for m in re.finditer(r"\]\(", masked):
            if not bracket and "[" not in masked[:m.start()]:
                continue
            d = _destination(line, masked, m.end())
            if d:
                links.append(Link(no, d[0], d[1], d[2], "inline"))
        bracket = bracket or "[" in masked
        for m in REF_USE.finditer(masked):
            uses.append((no, m.group(1)))
        for m in HTML_URL.finditer(masked):
            links.append(Link(no, line[m.start(1):m.end(1)], m.start(1), m.end(1), "html"))
    return links, uses


def ref_labels(text):
    """The normalised labels of the reference definitions of a text."""
    lines = text.split("\n")
    code = fenced(lines)
    labels = set()
    for line, is_code in zip(masked_lines(lines, code), code):
        if not is_code:
            m = REF_DEF.match(line)
            if m:
                labels.add(normalise_label(m.group(1)))
    return labels


def normalise_label(label):
    return " ".join(label.split()).casefold()


_ESCAPED = re.compile(r"\\([!-/:-@\[-`{-~])")
_IMAGE = re.compile(r"!\[((?:[^\]\\]|\\.)*)\]\([^)]*\)")
_LINK = re.compile(r"\[((?:[^\]\\]|\\.)*)\](?:\([^)]*\)|\[[^\]]*\])")
_AUTOLINK = re.compile(r"<((?:https?|mailto):[^>]*)>")
_TAG = re.compile(r"</?[A-Za-z][^>]*>")
_UNDERSCORE = re.compile(r"(?<![\w\\])(_{1,2})(?=\S)(.+?)(?<=\S)\1(?!\w)")


def heading_text(raw):
    """The text of a heading's inline Markdown as rendered (its textContent):
    code spans keep their content, links their text, images nothing, tags
    and emphasis markers go."""
    out = []
    i = 0
    n = len(raw)
    plain = []

    def flush():
        if plain:
            out.append(_inline_text("".join(plain)))
            plain.clear()

    while i < n:
        c = raw[i]
        if c == "\\" and i + 1 < n:
            plain.append(raw[i:i + 2])
            i += 2
            continue
        if c == "`":
            j, close = code_span(raw, i)
            if close < 0:
                plain.append(raw[i:j])
                i = j
                continue
            flush()
            k = close - (j - i)
            content = raw[j:k].replace("\n", " ")
            if len(content) > 1 and content[0] == " " and content[-1] == " " and content.strip():
                content = content[1:-1]
            out.append(content)
            i = close
            continue
        plain.append(c)
        i += 1
    flush()
    return "".join(out)


def _inline_text(s):
    # Escaped characters are literal: keep them out of the markup rules.
    keep = []

    def hold(m):
        keep.append(m.group(1))
        return "\x00%d\x00" % (len(keep) - 1)

    s = _ESCAPED.sub(hold, s)
    s = _IMAGE.sub("", s)
    for _ in range(3):
        s = _LINK.sub(r"\1", s)
    s = _AUTOLINK.sub(r"\1", s)
    s = _TAG.sub("", s)
    for _ in range(2):
        s = _UNDERSCORE.sub(r"\2", s)
    s = s.replace("*", "").replace("~~", "")
    s = html.unescape(s)
    return re.sub("\x00(\\d+)\x00", lambda m: keep[int(m.group(1))], s)


def slug(text):
    """GitHub's id for a heading's text: lower case, every character but
    letters, digits, "_", "-" and spaces dropped, spaces to "-"."""
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


class Slugger:
    """GitHub's ids of one page's headings in order: a repeated id gets
    "-1", "-2", ... (github-slugger's rule)."""

    def __init__(self):
        self.seen = {}

    def __call__(self, text):
        base = result = slug(text)
        while result in self.seen:
            self.seen[base] += 1
            result = "%s-%d" % (base, self.seen[base])
        self.seen[result] = 0
        return result


def headings(text):
    """The headings of a Markdown text: [(line, level, text, id)], with
    GitHub's ids."""
    lines = text.split("\n")
    code = fenced(lines)
    out = []
    slugger = Slugger()
    prev_para = False
    for no, (line, is_code) in enumerate(zip(lines, code), 1):
        if is_code:
            prev_para = False
            continue
        m = ATX.match(line)
        if m:
            raw = (m.group(2) or "").strip()
            t = heading_text(raw)
            out.append((no, len(m.group(1)), t, slugger(t)))
            prev_para = False
            continue
        s = SETEXT.match(line)
        if s and prev_para:
            raw = lines[no - 2].strip()
            t = heading_text(raw)
            out.append((no - 1, 1 if s.group(1)[0] == "=" else 2, t, slugger(t)))
            prev_para = False
            continue
        stripped = line.strip()
        prev_para = bool(stripped) and not stripped.startswith(("|", ">", "<", "- ", "* ", "+ ")) \
            and not re.match(r"^\d+[.)] ", stripped) and not line.startswith("    ")
    return out


def anchors(text):
    """Every id a link into the page may name: its headings' and those of
    its HTML elements (<a id=...>, <a name=...>)."""
    ids = {h[3] for h in headings(text)}
    lines = text.split("\n")
    code = fenced(lines)
    for line, is_code in zip(masked_lines(lines, code), code):
        if not is_code:
            for m in HTML_ID.finditer(line):
                ids.add(m.group(1))
    return ids


def is_external(url):
    """Whether a destination leaves the repository: a scheme (http:,
    mailto:, ...) or a network path (//host/...)."""
    return bool(SCHEME.match(url)) or url.startswith("//")


def repo_files(root):
    """Every file of the repository, relative to root: git's (tracked, and
    new files git does not ignore) in a work tree, else every file under
    root."""
    try:
        out = subprocess.run(
            ["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            check=True, capture_output=True).stdout.decode()
        return {p for p in out.split("\0") if p and os.path.isfile(os.path.join(root, p))}
    except (OSError, subprocess.CalledProcessError):
        files = set()
        for d, _, names in os.walk(root):
            for name in names:
                files.add(os.path.relpath(os.path.join(d, name), root).replace(os.sep, "/"))
        return files


def directories(files):
    """The directories that hold the files (relative paths, "a", "a/b")."""
    dirs = set()
    for f in files:
        parts = f.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]))
    return dirs
