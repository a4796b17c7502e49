"""How a process of ours ends once its work is done and said: `leave_process`, for every entry point that runs a
user's model (the command line, and the fresh processes export starts: confirmation, the whole-model check, the
route checks, the sanitizer's runs, the lane's worker)."""

from __future__ import annotations

import os
import sys


def leave_process(code: int) -> int:
    """The process's exit, once its work has returned `code` and said everything: where a thread that is not a
    daemon is still alive (a model's forward or builder started one and left it running), the output is flushed
    and the process ends now with `code`, without the interpreter's join of that thread. A model that left
    `threading.Thread(target=time.sleep, args=(1000,))` made capture hang after printing its cards, and a Ctrl-C
    then printed a traceback from threading._shutdown (red team F8); export's fresh processes wrote their result
    and then waited on it until their timeout killed them. Otherwise `code` is returned for the usual exit. Only
    for a process's own entry point (`if __name__ == "__main__"`, kforge_tui.cli.main with no argv): in-process
    callers (the tests) keep their threads."""
    import threading

    left = [t for t in threading.enumerate()
            if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if not left:
        return code
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: what could be said was said
            pass
    os._exit(code)
