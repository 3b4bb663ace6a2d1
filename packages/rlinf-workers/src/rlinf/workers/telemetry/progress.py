"""A dependency-free progress display: step/total, rate, ETA and a few metrics.

On a terminal it redraws one line in place; elsewhere (log files, CI, Ray workers) it
prints a plain line at most every `interval` seconds, plus the final one.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TextIO

from rlinf.workers.errors import ConfigError

__all__ = ["ProgressDisplay", "format_duration"]

_TTY_REFRESH_S = 0.1


def format_duration(seconds: float) -> str:
    """``"1:02:03"`` / ``"2:03"`` for a number of seconds; ``"?"`` when unknown."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = round(seconds)
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _format_value(v: float) -> str:
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    a = abs(v)
    return f"{v:.3e}" if a != 0 and (a < 1e-3 or a >= 1e5) else f"{v:.4g}"


class ProgressDisplay:
    """Shows training progress on `stream` (default stderr).

    Args:
        total: the step count at which the run is done.
        desc: label in front of the line (``"train"``).
        start: the step the run (re)starts from; the rate counts only steps done here.
        stream: where to write; a TTY gets one live line, anything else periodic lines.
        keys: metrics to show, in order; default the first four of each update.
        interval: seconds between plain lines on a non-TTY stream.
        clock: monotonic clock in seconds (tests pass a fake one).
    """

    def __init__(
        self, total: int, *, desc: str, start: int = 0, stream: TextIO | None = None,
        keys: Sequence[str] = (), interval: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if total < 0 or start < 0:
            raise ConfigError(f"ProgressDisplay total={total}, start={start}: both must be >= 0")
        self.total = total
        self.desc = desc
        self.start = start
        self.stream = stream if stream is not None else sys.stderr
        self.keys = tuple(keys)
        self.interval = interval
        self._clock = clock
        self._t0 = clock()
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_draw = float("-inf")
        self._pending: str | None = None
        self._step = start
        self._width = 0
        self._closed = False

    def line(self, step: int, metrics: Mapping[str, float]) -> str:
        """The text shown for `step` with `metrics` (without newline)."""
        elapsed = self._clock() - self._t0
        done = step - self.start
        rate = done / elapsed if elapsed > 0 and done > 0 else 0.0
        eta = (self.total - step) / rate if rate > 0 else float("nan")
        pct = 100.0 * step / self.total if self.total else 100.0
        keys = self.keys or tuple(list(metrics)[:4])
        shown = " ".join(f"{k}={_format_value(metrics[k])}" for k in keys if k in metrics)
        rate_text = f"{rate:.3g} step/s" if rate >= 1 or rate == 0 else f"{1 / rate:.3g} s/step"
        parts = [f"{self.desc} {step}/{self.total} ({pct:3.0f}%)", rate_text,
                 f"elapsed {format_duration(elapsed)}", f"eta {format_duration(eta)}"]
        return " | ".join([*parts, shown] if shown else parts)

    def update(self, step: int, metrics: Mapping[str, float]) -> None:
        """Report that `step` is done, with its metrics; draws when due."""
        if self._closed:
            return
        self._step = step
        now = self._clock()
        text = self.line(step, metrics)
        last = step >= self.total
        due = now - self._last_draw >= (_TTY_REFRESH_S if self._tty else self.interval)
        if last or due:
            self._draw(text)
            self._last_draw = now
        else:
            self._pending = text
        if last:
            self.close()

    def _draw(self, text: str) -> None:
        if self._tty:
            pad = " " * max(0, self._width - len(text))
            self.stream.write("\r" + text + pad)
            self._width = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self._pending = None

    def close(self) -> None:
        """Finish the display: show the last undisplayed update and end the live line."""
        if self._closed:
            return
        self._closed = True
        if self._pending is not None:
            self._draw(self._pending)
        if self._tty and self._width:
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> ProgressDisplay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
