# SPDX-License-Identifier: Apache-2.0
"""Runs the code blocks of tandem's Markdown files, so that what the docs
show keeps working (CTest's docs_blocks).

    run_blocks.py --root REPO [--bin DIR] [--build DIR] [--cxx 'CXX -I DIR ...'] [FILE.md ...]

The convention (docs/README.md, "Code blocks that run"): a fenced block runs
according to its language, unless the line before its fence says
`<!-- docs: not run: REASON -->`.

- python: the blocks of one file run in order in one interpreter (this one),
  so a block sees what earlier blocks of its file defined; a traceback names
  the Markdown file and line.
- sh: each block runs with `bash -euo pipefail`.
- console: each `$ ` line runs; it must exit 0, or with the status the
  transcript shows on the line after a following `$ echo $?`. The other
  lines are the output as a reader sees it, not compared.
- cpp: a file's blocks are compiled (not run) in one function, each in a
  scope inside the previous one's, after declarations of the sizes and
  buffers the snippets take (docs/blocks/prelude.inc); their #include lines
  go before the function, after tandem's headers.
- text, json, cmake and blocks without a language are samples: never run.

A file may give a block setup that readers do not need to see (the arrays
a snippet takes), in an HTML comment that Markdown renderers hide:

    <!-- docs: setup python
    q = ...
    -->

The setup runs where it stands, before the blocks after it. Every block runs in a scratch
directory in which python/, tests/ and tools/ link to the repository's, with
--bin (the tandem command's directory) first on PATH. Exits 1 naming
file:line of each block that failed.
"""

import argparse
import glob
import os
import re
import shlex
import subprocess
import sys
import tempfile
import traceback

FENCE = re.compile(r"^(`{3,})\s*([\w+-]*)")
NOT_RUN = re.compile(r"^<!-- docs: not run: .+ -->$")
SETUP = re.compile(r"^<!-- docs: setup (python)$")
CPP_HEADERS = ["cstdint", "span", "vector", "tandem/tandem.hpp", "tandem/reference/backend.hpp",
               "tandem/optimized/backend.hpp"]
SAMPLES = {"", "text", "json", "cmake"}
RUNNERS = {"python", "sh", "console", "cpp"}


class Block:
    """One fenced block (or setup comment): its language, where its code
    starts (1-based line of the first code line) and its code."""

    def __init__(self, path, lang, line, code, setup=False):
        self.path, self.lang, self.line, self.code, self.setup = path, lang, line, code, setup

    def where(self):
        return f"{self.path}:{self.line}"


def closing(lines, i, is_end, what, path):
    """The index of the first line after line i that is_end accepts."""
    for j in range(i + 1, len(lines)):
        if is_end(lines[j]):
            return j
    raise ValueError(f"{path}:{i + 1}: {what} is never closed")


def parse(path, text):
    """The blocks of a Markdown file that run, in order; raises ValueError
    for a block in a language with no rule (so none is skipped silently)."""
    lines = text.split("\n")
    blocks, i = [], 0
    while i < len(lines):
        setup = SETUP.match(lines[i])
        fence = FENCE.match(lines[i])
        if setup:
            end = closing(lines, i, lambda t: t == "-->", "the setup", path)
            blocks.append(Block(path, setup.group(1), i + 2,
                                "\n".join(lines[i + 1:end]), setup=True))
            i = end + 1
        elif fence:
            end = closing(lines, i, lambda t: t.strip().startswith(fence.group(1)),
                          "the block", path)
            lang = fence.group(2)
            skipped = i > 0 and NOT_RUN.match(lines[i - 1].strip())
            if lang not in SAMPLES | RUNNERS:
                raise ValueError(f"{path}:{i + 1}: ```{lang} has no rule in run_blocks.py"
                                 " (mark it <!-- docs: not run: REASON -->)")
            if lang in RUNNERS and not skipped:
                blocks.append(Block(path, lang, i + 2, "\n".join(lines[i + 1:end])))
            i = end + 1
        else:
            i += 1
    return blocks


def run_python(blocks):
    """Runs a file's python blocks in one namespace; the failures' messages."""
    namespace, failures = {"__name__": "__docs__"}, []
    for b in blocks:
        try:
            # Leading newlines make tracebacks give the Markdown file's line numbers.
            exec(compile("\n" * (b.line - 1) + b.code, b.path, "exec"), namespace)
        except BaseException:  # a failing block, SystemExit included, is reported
            failures.append(f"{b.where()}: python block failed:\n{traceback.format_exc()}")
            break  # later blocks of the file may need what this one defines
    return failures


def console_commands(block):
    """(line, command, expected exit status) of each `$ ` line of a console
    block; `$ echo $?` followed by a number sets the previous command's."""
    lines = block.code.split("\n")
    commands = []
    for n, text in enumerate(lines):
        if not text.startswith("$ "):
            continue
        if text == "$ echo $?" and commands and n + 1 < len(lines) and lines[n + 1].isdigit():
            commands[-1] = (*commands[-1][:2], int(lines[n + 1]))
        else:
            commands.append((block.line + n, text[2:], 0))
    return commands


def run_shell(block):
    """Runs an sh block, or each command of a console block; the failures."""
    if block.lang == "sh":
        runs = [(block.line, block.code, 0, ["bash", "-euo", "pipefail", "-c", block.code])]
    else:
        runs = [(line, cmd, rc, ["bash", "-c", cmd]) for line, cmd, rc in console_commands(block)]
    failures = []
    for line, cmd, expected, argv in runs:
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != expected:
            failures.append(f"{block.path}:{line}: {block.lang} `{cmd}` exited {done.returncode}"
                            f" (the docs show {expected}):\n{done.stdout}{done.stderr}")
    return failures


def cpp_source(blocks):
    """One translation unit for a file's cpp blocks: tandem's headers and the
    blocks' #include lines, then a function that declares the names the
    snippets take (docs/blocks/prelude.inc) and in which each block opens a
    scope inside the previous one, so it sees the earlier blocks' names and
    may declare them again. #line keeps the Markdown's line numbers."""
    includes = [f"#include <{h}>" for h in CPP_HEADERS]
    body = ["void docs_blocks() {", '#include "prelude.inc"']
    for b in blocks:
        body += ["{", f'#line {b.line} "{b.path}"']
        for text in b.code.split("\n"):
            if text.startswith("#include"):
                includes.append(text)
                text = ""  # keeps the line numbers
            body.append(text)
    return "\n".join(includes + body + ["}" * len(blocks), "}", ""])


def run_cpp(blocks, cxx):
    """Compiles a file's cpp blocks (-fsyntax-only); the failures."""
    if not cxx:
        return [f"{blocks[0].where()}: cpp blocks need --cxx"]
    with tempfile.NamedTemporaryFile("w", suffix=".cpp", delete=False) as f:
        f.write(cpp_source(blocks))
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        done = subprocess.run([*cxx, "-std=c++20", "-fsyntax-only", "-I", here, f.name],
                              capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    if done.returncode != 0:
        return [f"{blocks[0].path}: cpp blocks do not compile:\n{done.stderr}"]
    return []


def markdown_files(root):
    """The Markdown files a reader meets: the READMEs, the pages, the spec."""
    patterns = ["*.md", "*/README.md", "*/*/README.md", "docs/*.md", "docs/pages/*.md"]
    found = {os.path.relpath(p, root)
             for pattern in patterns for p in glob.glob(os.path.join(root, pattern))}
    return sorted(p for p in found if not p.startswith(("build", ".venv", "report")))


def scratch_dir(root, build):
    """A directory to run blocks in: python/, tests/, tools/ (and build/) are links."""
    work = tempfile.mkdtemp(prefix="tandem-docs-blocks-")
    for name in ("python", "tests", "tools"):
        os.symlink(os.path.join(root, name), os.path.join(work, name))
    if build:
        os.symlink(os.path.abspath(build), os.path.join(work, "build"))
    return work


def run_file(path, root, args):
    """Runs one file's blocks in a fresh scratch directory; (counts, failures)."""
    with open(os.path.join(root, path), encoding="utf-8") as f:
        blocks = parse(path, f.read())
    here = os.getcwd()
    os.chdir(scratch_dir(root, args.build))
    try:
        failures = []
        python = [b for b in blocks if b.lang == "python"]
        if python:
            failures += run_python(python)
        for b in blocks:
            if b.lang in ("sh", "console") and not b.setup:
                failures += run_shell(b)
        cpp = [b for b in blocks if b.lang == "cpp"]
        if cpp:
            os.chdir(root)  # the compiler reads the blocks' #line paths from the root
            failures += run_cpp(cpp, args.cxx)
    finally:
        os.chdir(here)
    counts = {}
    for b in blocks:
        if not b.setup:
            counts[b.lang] = counts.get(b.lang, 0) + 1
    return counts, failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", required=True, help="the repository")
    parser.add_argument("--bin", help="directory of the tandem command, first on PATH")
    parser.add_argument("--build", help="the build directory, linked as build/")
    parser.add_argument("--cxx", type=shlex.split,
                        help="compiler and flags for cpp blocks, one string")
    parser.add_argument("files", nargs="*", help="Markdown files (default: all, from --root)")
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    if args.bin:
        os.environ["PATH"] = os.path.abspath(args.bin) + os.pathsep + os.environ["PATH"]
    total, failures = {}, []
    for path in args.files or markdown_files(root):
        counts, failed = run_file(os.path.relpath(os.path.abspath(path), root)
                                  if args.files else path, root, args)
        for lang, n in counts.items():
            total[lang] = total.get(lang, 0) + n
        failures += failed
    for message in failures:
        print(message, file=sys.stderr)
    ran = ", ".join(f"{n} {lang}" for lang, n in sorted(total.items()))
    print(f"docs blocks: {ran or 'none'} run; {len(failures)} failed")
    return 1 if failures or not total else 0


if __name__ == "__main__":
    sys.exit(main())
