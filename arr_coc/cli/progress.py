"""A one-line stage printer for the commands that sit silent for seconds (``look``, ``ask``).

``show = progress.stages(args)`` then ``show("loading the model")`` before each slow step and
``show.close()`` before the result is printed. It writes to stderr only, never to stdout (``--json``
stays clean):

- on a terminal (the default there), one line rewritten in place, ``arr-coc: allocating ... 3 s``,
  drawn only once the command has run for more than a second and wiped before the result: a fast
  command prints nothing;
- with ``--progress`` where stderr is no terminal (a log, a pipe), one line per finished stage,
  ``arr-coc: allocating: 3.2 s``;
- with ``--no-progress``, or by default where stderr is no terminal, nothing.
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Callable, TextIO

__all__ = ["DELAY_S", "Stages", "add_option", "stages", "stop"]

DELAY_S = 1.0  # a command shorter than this shows no progress line
TICK_S = 0.5  # how often the live line is redrawn
CLEAR = "\r\x1b[K"  # carriage return + erase to the end of the line

_active: list[Stages] = []  # the printer of the running command, so that main() can wipe its line on any exit


def add_option(parser: argparse.ArgumentParser) -> None:
    """``--progress`` / ``--no-progress`` on a command's parser."""
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="a stage line on stderr while the command works (never on stdout); default: on when "
                             "stderr is a terminal, after the first second")


def stages(args: argparse.Namespace, stream: TextIO | None = None) -> Stages:
    """The command's stage printer, as ``--progress`` / ``--no-progress`` and stderr say."""
    stream = sys.stderr if stream is None else stream
    wanted = getattr(args, "progress", None)
    live = stream.isatty()
    printer = Stages(stream, enabled=live if wanted is None else wanted, live=live)
    _active.append(printer)
    return printer


def stop() -> None:
    """Closes the running command's printer, if any: its line is wiped before an error or the result is printed."""
    while _active:
        _active.pop().close()


class Stages:
    """Names the stage a command is in. ``live``: redraw one line on a terminal from a thread; otherwise write
    one line per finished stage. ``clock`` is injectable so that tests read exact durations."""

    def __init__(self, stream: TextIO, enabled: bool = True, live: bool = False, delay: float = DELAY_S,
                 tick: float = TICK_S, clock: Callable[[], float] = time.perf_counter) -> None:
        self.stream, self.enabled, self.live, self.delay, self.tick, self.clock = (
            stream, enabled, live, delay, tick, clock)
        self.name: str | None = None
        self.began = self.stage_began = clock()
        self.drawn = False
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self, name: str) -> None:
        """Ends the current stage (if any) and starts ``name``."""
        if not self.enabled:
            return
        with self._lock:
            self._finish()
            self.name, self.stage_began = name, self.clock()
        if self.live and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="arr-coc-progress", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Ends the last stage; on a terminal, wipes the line so the result starts on a clean one."""
        if not self.enabled:
            return
        self._done.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            self._finish()
            self.name = None
            if self.drawn:
                self.stream.write(CLEAR)
                self.stream.flush()
                self.drawn = False

    def _finish(self) -> None:
        if self.name is not None and not self.live:
            self.stream.write(f"arr-coc: {self.name}: {self.clock() - self.stage_began:.1f} s\n")
            self.stream.flush()

    def _run(self) -> None:
        while not self._done.wait(self.tick):
            self.draw()

    def draw(self) -> None:
        """The live line, once the command has run longer than ``delay`` (called by the thread every ``tick``)."""
        with self._lock:
            now = self.clock()
            if self.name is None or now - self.began < self.delay:
                return
            self.stream.write(f"{CLEAR}arr-coc: {self.name} ... {now - self.stage_began:.0f} s")
            self.stream.flush()
            self.drawn = True
