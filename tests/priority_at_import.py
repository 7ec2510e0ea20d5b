"""A module that notes its process's priority as it is imported: how low a spawned helper
process already runs when it first imports anything of its work."""

from __future__ import annotations

import os

AT_IMPORT = os.getpriority(os.PRIO_PROCESS, 0)


def start() -> None:
    """A helper's initializer: the worker imports this module to unpickle it."""


def noted() -> int:
    return AT_IMPORT
