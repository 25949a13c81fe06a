"""The exceptions that mean "the input was wrong", not "the code is wrong".

The CLI prints these (and the ``ValueError`` / ``OSError`` the library raises for a bad value or an
unreadable file) as one ``arr-coc: error: ...`` line and exits 2; every other exception is a bug and
keeps its traceback.
"""
from __future__ import annotations


class UserError(Exception):
    """Base of the errors a user fixes by changing the command, its files or the installed extras."""


class MissingDependencyError(UserError, ImportError):
    """An optional package or model a requested component needs is not installed; says what to install."""


class ThreadLimitError(UserError, RuntimeError):
    """The environment's OpenMP thread limit would silently corrupt a computation; says what to change."""


class WeightsError(UserError, ValueError):
    """A weights or checkpoint file that does not fit what it is loaded into; names the file and what is wrong."""


class DiskFullError(UserError, OSError):
    """A file could not be written for lack of space; nothing half-written is left; says where and how much is free."""
