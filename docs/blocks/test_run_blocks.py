# SPDX-License-Identifier: Apache-2.0
"""run_blocks.py rejects docs/blocks/broken.md, naming the line of each
wrong block and of no other (CTest's docs_blocks_reject_broken).

    test_run_blocks.py CXX_COMMAND    # as run_blocks.py's --cxx
"""

import os
import re
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CXX = sys.argv.pop(1) if len(sys.argv) > 1 else "c++"

sys.path.insert(0, HERE)
import run_blocks  # noqa: E402


class RejectsBrokenBlocks(unittest.TestCase):
    def test_each_wrong_block_is_named_by_its_line(self):
        done = subprocess.run([sys.executable, os.path.join(HERE, "run_blocks.py"), "--root", ROOT,
                               "--cxx", CXX, os.path.join(HERE, "broken.md")],
                              capture_output=True, text=True, cwd=ROOT)
        self.assertEqual(done.returncode, 1, done.stdout + done.stderr)
        named = set(re.findall(r"^docs/blocks/broken\.md:(\d+)", done.stderr, re.M))
        # python NameError, console `false`, a wrong exit status, sh, the cpp error
        self.assertEqual(named, {"14", "24", "28", "34", "41"}, done.stderr)
        self.assertIn("no_such_field", done.stderr)
        self.assertIn("5 failed", done.stdout)

    def test_a_block_in_a_language_without_a_rule_is_an_error(self):
        with self.assertRaisesRegex(ValueError, r"x\.md:3: ```rust has no rule"):
            run_blocks.parse("x.md", "text\n\n```rust\nfn main() {}\n```\n")

    def test_samples_and_marked_blocks_are_not_run(self):
        text = ("```text\n$ false\n```\n<!-- docs: not run: an example -->\n```sh\nfalse\n```\n"
                "```python\npass\n```\n")
        self.assertEqual([(b.lang, b.line) for b in run_blocks.parse("x.md", text)],
                         [("python", 9)])


if __name__ == "__main__":
    unittest.main()
