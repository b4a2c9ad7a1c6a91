"""Progress of a run: one line per phase that updates in place on a terminal, plain lines in a log.

On a terminal a phase's line is redrawn (`\\r`) as the real processes report their iterations; when
the output is a file or a pipe only the start and the end of each phase are written, so a log
stays short.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Phase lines on `stream` (default stderr, so a report on stdout stays clean)."""

    def __init__(self, stream: TextIO | None = None, *, quiet: bool = False) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.quiet = quiet
        self._phase = ""
        self._started_s = 0.0
        self._width = 0

    @property
    def phase(self) -> str:
        """The phase under way (or the last one begun)."""
        return self._phase

    def begin(self, phase: str) -> None:
        """A phase starts (printed at once, on a terminal and in a log)."""
        self._phase, self._started_s = phase, time.monotonic()
        if self.tty:
            self._draw(f"{phase} ...")
        else:
            self._line(f"{phase} ...")

    def update(self, detail: str) -> None:
        """Where the phase is (terminal only)."""
        if self.tty:
            self._draw(f"{self._phase}: {detail}")

    def end(self, outcome: str = "done") -> float:
        """The phase ended; returns its wall time in seconds."""
        elapsed_s = time.monotonic() - self._started_s
        text = f"{self._phase}: {outcome} in {elapsed_s:.1f} s"
        if self.tty:
            self._draw(text)
            self._write("\n")
            self._width = 0
        else:
            self._line(text)
        return elapsed_s

    def _draw(self, text: str) -> None:
        padding = max(self._width - len(text), 0)
        self._width = len(text)
        self._write("\r" + text + " " * padding)

    def _line(self, text: str) -> None:
        self._write(text + "\n")

    def _write(self, text: str) -> None:
        if self.quiet:
            return
        self.stream.write(text)
        self.stream.flush()
