# SPDX-License-Identifier: Apache-2.0
"""tandem.Error, raised for every invalid call (the C++ tandem::Error too)."""

__all__ = ["Error"]


class Error(ValueError):
    """An invalid call: the message names the parameter, the value given and
    what was expected; `parameter` holds the parameter's name. Nothing was
    written when it is raised."""

    def __init__(self, message, parameter=None):
        super().__init__(message)
        self.parameter = parameter
