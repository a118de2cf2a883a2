# SPDX-License-Identifier: Apache-2.0
"""A document of blocks (headings, paragraphs, lists, tables, images, code) rendered both
as Markdown and as HTML; paragraphs may hold `code` and **bold**."""
import html
import re

HTML_HEAD = (
    "<!doctype html><html><head><meta charset='utf-8'><title>tandem performance report</title>",
    "<style>body{font-family:sans-serif;max-width:1150px;margin:2em auto;padding:0 1em}"
    "table{border-collapse:collapse;margin:1em 0;font-size:90%}td,th{border:1px solid #ccc;"
    "padding:3px 7px;text-align:left}th{background:#f0f0f0}img{max-width:100%}"
    "code,pre{background:#f6f6f6}</style></head><body>")


class Doc:
    """Blocks rendered to both Markdown and HTML."""

    def __init__(self):
        self.blocks = []

    def h(self, level, text):
        self.blocks.append(("h", level, text))

    def p(self, text):
        self.blocks.append(("p", text))

    def ul(self, items):
        self.blocks.append(("ul", items))

    def table(self, head, rows):
        self.blocks.append(("table", head, rows))

    def img(self, path, alt):
        self.blocks.append(("img", path, alt))

    def code(self, text):
        self.blocks.append(("code", text))

    def markdown(self):
        return "\n\n".join(markdown_block(b) for b in self.blocks) + "\n"

    def html(self):
        return "\n".join([*HTML_HEAD, *(html_block(b) for b in self.blocks), "</body></html>"])


def markdown_table(head, rows):
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(lines)


def markdown_block(b):
    kind = b[0]
    if kind == "h":
        return "#" * b[1] + " " + b[2]
    if kind == "p":
        return b[1]
    if kind == "ul":
        return "\n".join(f"- {i}" for i in b[1])
    if kind == "table":
        return markdown_table(b[1], b[2])
    if kind == "img":
        return f"![{b[2]}]({b[1]})"
    return "```\n" + b[1] + "\n```"


def inline(t):
    """HTML of a paragraph's text: escaped, `code` and **bold** marked up."""
    t = html.escape(t)
    t = re.sub(r"`([^`]+)`", r"<code>\1</code>", t)
    t = re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", t)
    return t


def html_table(head, rows):
    return ("<table><tr>" + "".join(f"<th>{inline(h)}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{inline(str(c))}</td>" for c in r) + "</tr>"
                      for r in rows) + "</table>")


def html_block(b):
    kind = b[0]
    if kind == "h":
        return f"<h{b[1]}>{inline(b[2])}</h{b[1]}>"
    if kind == "p":
        return f"<p>{inline(b[1])}</p>"
    if kind == "ul":
        return "<ul>" + "".join(f"<li>{inline(i)}</li>" for i in b[1]) + "</ul>"
    if kind == "table":
        return html_table(b[1], b[2])
    if kind == "img":
        return f"<p><img src='{html.escape(b[1])}' alt='{html.escape(b[2])}'></p>"
    return f"<pre>{html.escape(b[1])}</pre>"
