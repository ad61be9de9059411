"""Progress of `epp bench` on stderr: a redrawn bar on a terminal, plain lines when asked off one.

CI logs must stay readable: off a TTY nothing is written unless `--progress` asks, and then it is
one line per tenth of the run instead of carriage-return redraws. Progress is the share of the
workload's arrival window done in virtual time; past it the run drains the requests in flight.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

_WIDTH = 30


class Progress:
    def __init__(self, *, enabled: bool, stream: TextIO | None = None, tty: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = self.stream.isatty() if tty is None else tty
        self._label = ""
        self._started = 0.0
        self._drawn = 0.0
        self._tenth = -1

    def start(self, label: str) -> None:
        self._label = label
        self._started = time.perf_counter()
        self._drawn = 0.0
        self._tenth = -1
        self.update(0.0)

    def update(self, fraction: float) -> None:
        """Report `fraction` of the arrival window done (> 1 while draining)."""
        if not self.enabled:
            return
        now = time.perf_counter()
        elapsed = now - self._started
        if not self.tty:
            tenth = min(int(fraction * 10), 10)
            if tenth > self._tenth:
                self._tenth = tenth
                self.stream.write(f"{self._label}: {min(fraction, 1.0):.0%} after {elapsed:.1f} s\n")
            return
        if now - self._drawn < 0.1:  # at most 10 redraws a second
            return
        self._drawn = now
        done = int(_WIDTH * min(max(fraction, 0.0), 1.0))
        state = f"{fraction:4.0%}" if fraction < 1.0 else "drain"
        self.stream.write(f"\r{self._label} [{'#' * done}{'-' * (_WIDTH - done)}] {state} {elapsed:6.1f} s")
        self.stream.flush()

    def finish(self, note: str = "") -> None:
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self._started
        end = f" {note}" if note else ""
        pad = " " * (_WIDTH + 8) if self.tty else ""
        self.stream.write(f"{chr(13) if self.tty else ''}{self._label}: done in {elapsed:.1f} s{end}{pad}\n")
        self.stream.flush()
