"""The site's Markdown extension (mkdocs.yml: gfm, on PYTHONPATH): what
the site needs so that a page reads as GitHub renders it.

Ids: each heading gets the id GitHub gives it (mdlinks.Slugger: lower
case, punctuation dropped but "-" and "_", spaces to "-", a repeated id
"-1", "-2", ...), where the toc extension's default would collapse
"a -- b" to "a-b" and number a repeated id "_1". So one link,
[text](page.md#id), works on GitHub and on the site. Runs after the
inline patterns and attr_list, before toc (which keeps an id a heading
has).

Lists: GitHub nests a list item's content at the column its text starts
at ("1. " three, "- " two); Python-Markdown at multiples of four. Before
the blocks are read, the content of each list item is moved to
Python-Markdown's column, fences within it too (pymdownx.superfences then
reads them inside the item); the next lines of a paragraph lose their
indent (GitHub drops it; Python-Markdown would keep it in a code span);
and an item or a fence that follows a line of text is set off by a blank
line, as Python-Markdown needs to see an item or a fence there and not
more text (a list may so be loose where GitHub's is tight: its items are
paragraphs). Nothing but leading spaces and blank lines changes (checked:
the text without them is the same).
"""

import html
import os
import re
import sys

from markdown.extensions import Extension
from markdown.extensions.toc import get_name, stashedHTML2text, unescape
from markdown.preprocessors import Preprocessor
from markdown.treeprocessors import Treeprocessor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mdlinks  # noqa: E402

HEADING = re.compile(r"[Hh][1-6]$")
MARKER = re.compile(r"^( *)([-*+]|\d{1,9}[.)])( {1,4})(?=\S)")
FENCE = re.compile(r"^ *(`{3,}|~{3,})")


class GfmIdsTreeprocessor(Treeprocessor):
    def run(self, doc):
        slugger = mdlinks.Slugger()
        for el in doc.iter():
            if isinstance(el.tag, str) and HEADING.match(el.tag):
                text = html.unescape(unescape(stashedHTML2text(get_name(el), self.md, strip_entities=False)))
                heading_id = slugger(text)
                if "id" not in el.attrib and heading_id:
                    el.attrib["id"] = heading_id


def indent_of(line):
    return len(line) - len(line.lstrip(" "))


def gfm_lists(lines):
    """The lines with list items' content moved to Python-Markdown's
    columns (see the module's comment)."""
    out = []
    stack = []  # open items: (content column in the source, content column out)
    fence = None  # an open fence: (its marker, column in, column out)
    code = False  # in an indented code block outside any list
    prev_blank = True

    def blank():
        if out and out[-1] != "":
            out.append("")

    for line in lines:
        line = line.expandtabs(4)
        if not line.strip():
            out.append("")
            prev_blank = True
            continue
        indent = indent_of(line)
        if fence is not None:
            _, src, dst = fence
            out.append(" " * dst + line[min(indent, src):])
            m = FENCE.match(line)
            if m and m.group(1)[0] == fence[0][0] and len(m.group(1)) >= len(fence[0]) \
                    and not line[m.end():].strip():
                fence = None
                out.append("")
            prev_blank = False
            continue
        if code and indent >= 4:
            out.append(line)
            continue
        code = False
        if not stack and indent >= 4 and prev_blank:
            code = True
            out.append(line)
            continue
        m = MARKER.match(line)
        if m and m.group(2)[0].isdigit() and int(m.group(2)[:-1]) != 1 and not prev_blank \
                and not stack:
            m = None  # an ordered list starting at 2 or more cannot interrupt a paragraph
        if not m and stack and indent < stack[-1][0] and not prev_blank:
            out.append(line.lstrip(" "))  # a lazy continuation of the item's paragraph
            continue
        while stack and indent < stack[-1][0]:
            stack.pop()
        if m:
            base = stack[-1][1] if stack else 0
            marker = m.group(2)
            spaces = len(m.group(3)) if len(m.group(3)) <= 4 else 1
            if not prev_blank and out and not MARKER.match(out[-1]):
                blank()
            out.append(" " * base + marker + " " + line[m.end():])
            stack.append((indent + len(marker) + spaces, base + 4))
            prev_blank = False
            continue
        src, dst = stack[-1] if stack else (0, 0)
        f = FENCE.match(line)
        if stack and not f and out and out[-1].strip() and line.lstrip()[0] not in "|<#>":
            # The next line of a paragraph of the item: GitHub drops its
            # indent, and so does Python-Markdown for a lazy line.
            out.append(line.lstrip(" "))
            prev_blank = False
            continue
        new = " " * dst + line[src:]
        if f:
            fence = (f.group(1), src, dst)
            blank()
        out.append(new)
        prev_blank = False
    return out


class GfmListsPreprocessor(Preprocessor):
    def run(self, lines):
        out = gfm_lists(lines)
        if "".join("".join(lines).split()) != "".join("".join(out).split()):
            raise ValueError("gfm: moving list content changed more than whitespace")
        return out


class GfmExtension(Extension):
    def extendMarkdown(self, md):
        md.preprocessors.register(GfmListsPreprocessor(md), "gfm_lists", 27)
        md.treeprocessors.register(GfmIdsTreeprocessor(md), "gfm_ids", 6)


def makeExtension(**kwargs):
    return GfmExtension(**kwargs)
