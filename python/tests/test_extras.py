# SPDX-License-Identifier: Apache-2.0
"""Importing a module of the package without the extra it needs raises
tandem.MissingExtra (a ModuleNotFoundError) naming the extra to install, in a
fresh interpreter in which the dependency cannot be imported."""

import subprocess
import sys

import pytest

import tandem

CASES = [  # module, the package made unimportable, the message
    ("tandem.torch", "torch", "tandem.torch needs PyTorch >= 2.4: pip install 'tandem[torch]'"),
    ("tandem.flex", "torch", "tandem.flex needs PyTorch >= 2.4: pip install 'tandem[torch]'"),
    ("tandem.testing", "hypothesis",
     "tandem.testing needs Hypothesis: pip install 'tandem[testing]'"),
    ("tandem.transformers", "transformers",
     "tandem.transformers needs transformers >= 4.53: pip install 'tandem[transformers]'"),
    ("tandem.transformers", "transformers.masking_utils",  # as in transformers < 4.53
     "tandem.transformers needs transformers >= 4.53: pip install 'tandem[transformers]'"),
    ("tandem.transformers", "torch",
     "tandem.torch needs PyTorch >= 2.4: pip install 'tandem[torch]'"),
]

PROBE = """
import sys
sys.modules[{blocked!r}] = None  # `import {blocked}` now raises ModuleNotFoundError
try:
    import {module}
except ModuleNotFoundError as e:
    import tandem
    assert isinstance(e, tandem.MissingExtra), type(e)
    print(e)
else:
    print("imported")
"""


@pytest.mark.parametrize("module, blocked, message", CASES)
def test_a_missing_extra_is_named(module, blocked, message):
    done = subprocess.run([sys.executable, "-c", PROBE.format(module=module, blocked=blocked)],
                          capture_output=True, text=True, check=True)
    assert done.stdout.startswith(message + " ("), done.stdout


def test_missing_extra_is_an_import_error():
    e = tandem.MissingExtra("tandem.torch", "PyTorch >= 2.4", "torch", "torch")
    assert isinstance(e, ImportError) and e.name == "torch" and e.extra == "torch"
    assert str(e) == "tandem.torch needs PyTorch >= 2.4: pip install 'tandem[torch]'"
