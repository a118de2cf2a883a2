# SPDX-License-Identifier: Apache-2.0
"""tandem.Error, raised for every invalid call (the C++ tandem::Error too),
and MissingExtra, raised when a module of the package is imported without
the optional dependency (pyproject.toml's extras) it needs."""

__all__ = ["Error", "MissingExtra"]


class Error(ValueError):
    """An invalid call: the message names the parameter, the value given and
    what was expected; `parameter` holds the parameter's name. Nothing was
    written when it is raised."""

    def __init__(self, message, parameter=None):
        super().__init__(message)
        self.parameter = parameter


class MissingExtra(ModuleNotFoundError):
    """`module` (e.g. "tandem.torch") was imported without the package it
    needs (`name`, e.g. "torch"), or with a release older than it needs: the
    message says which extra installs it (pip install 'tandem[extra]'). A
    ModuleNotFoundError, so an `except ImportError` that probes for the
    module still works."""

    def __init__(self, module, needs, extra, name, detail=None):
        message = f"{module} needs {needs}: pip install 'tandem[{extra}]'"
        if detail is not None:
            message += f" ({detail})"
        super().__init__(message, name=name)
        self.extra = extra
