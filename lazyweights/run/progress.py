"""A thread-safe progress bar on stderr: bytes done of total, rate, elapsed.

Off by default in the library (`progress=False`), on in the command line. It redraws at most ten times a
second whatever the number of blocks, and writes a plain line per redraw when stderr is not a terminal.

Example:
    >>> import io
    >>> from lazyweights.run.progress import Progress
    >>> buf = io.StringIO()
    >>> bar = Progress(2 << 20, "save", stream=buf, min_interval=0)
    >>> bar.advance(1 << 20); bar.close()
    >>> "2 MiB / 2 MiB" in buf.getvalue()
    True
"""
from __future__ import annotations

import sys
import threading
import time

from ..core.units import format_bytes


class Progress:
    """A byte-count progress line on a stream (stderr by default), redrawn at most every `min_interval` s.

    Thread-safe: every worker calls `advance` with the bytes it produced; `close` draws the final line.
    """

    def __init__(self, total: int, label: str = "", stream=None, min_interval: float = 0.1):
        self.total = max(0, int(total))
        self.label = label
        self.stream = stream or sys.stderr
        self.min_interval = min_interval
        self.done = 0
        self.start = time.perf_counter()
        self._last = 0.0
        self._lock = threading.Lock()
        self._tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def advance(self, nbytes: int) -> None:
        """Count `nbytes` more done and redraw if `min_interval` has passed."""
        with self._lock:
            self.done += nbytes
            now = time.perf_counter()
            if now - self._last >= self.min_interval:
                self._last = now
                self._draw(now)

    def _draw(self, now: float, final: bool = False) -> None:
        elapsed = max(now - self.start, 1e-9)
        frac = self.done / self.total if self.total else 1.0
        width = 24
        filled = int(width * min(1.0, frac))
        bar = "#" * filled + "-" * (width - filled)
        line = (f"{self.label} [{bar}] {format_bytes(self.done)} / {format_bytes(self.total)} "
                f"{format_bytes(self.done / elapsed)}/s {elapsed:.1f}s")
        if self._tty:
            self.stream.write("\r" + line + ("\n" if final else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        """Draw the final line (counting the total as done when one was given)."""
        with self._lock:
            self.done = max(self.done, self.total) if self.total else self.done
            self._draw(time.perf_counter(), final=True)
