"""Errors a user can act on. The CLI prints their message as one line and exits with their code."""

from __future__ import annotations


class KforgeError(Exception):
    """Base for errors shown to the user as one line (no traceback without --debug)."""

    exit_code = 1


class UsageError(KforgeError):
    """Bad usage or bad input: a missing file, an invalid config, an absent device. Exit code 2."""

    exit_code = 2


class JobError(KforgeError):
    """The job itself failed (not the user's input). Exit code 1."""

    exit_code = 1


def signal_name(returncode: int) -> str:
    """What killed a child process, from its (negative) return code: 'SIGSEGV', or 'signal 77' for a number
    this platform does not name."""
    import signal

    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"
