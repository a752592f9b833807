"""A Markdown extension of the site (mkdocs.yml): each heading gets the id
GitHub gives it (mdlinks.Slugger: lower case, punctuation dropped but "-"
and "_", spaces to "-", a repeated id "-1", "-2", ...), where the toc
extension's default would collapse "a -- b" to "a-b" and number a
repeated id "_1". So one link, [text](page.md#id), works on GitHub and on
the site. Runs after the inline patterns and attr_list, before toc (which
keeps an id a heading has).
"""

import html
import os
import re
import sys

from markdown.extensions import Extension
from markdown.extensions.toc import get_name, stashedHTML2text, unescape
from markdown.treeprocessors import Treeprocessor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mdlinks  # noqa: E402

HEADING = re.compile(r"[Hh][1-6]$")


class GfmIdsTreeprocessor(Treeprocessor):
    def run(self, doc):
        slugger = mdlinks.Slugger()
        for el in doc.iter():
            if isinstance(el.tag, str) and HEADING.match(el.tag):
                text = html.unescape(unescape(stashedHTML2text(get_name(el), self.md, strip_entities=False)))
                heading_id = slugger(text)
                if "id" not in el.attrib and heading_id:
                    el.attrib["id"] = heading_id


class GfmIdsExtension(Extension):
    def extendMarkdown(self, md):
        md.treeprocessors.register(GfmIdsTreeprocessor(md), "gfm_ids", 6)


def makeExtension(**kwargs):
    return GfmIdsExtension(**kwargs)
