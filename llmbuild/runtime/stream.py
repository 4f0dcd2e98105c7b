"""A reply's text as tokens arrive: what may be printed now, and where a stop string ends the reply.

Printing token by token needs care: one character can span several byte-level tokens (the decoder shows
U+FFFD until it is complete), and text that could be the start of a stop string must wait until it is
known not to be one, so a stop string is never shown.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


class TextStream:
    def __init__(self, decode: Callable[[list[int]], str], stops: Sequence[str] = ()):
        self._decode = decode
        self.stops = tuple(s for s in stops if s)
        self.ids: list[int] = []
        self.text = ""  # the reply so far, cut before a stop string once one appears
        self.stopped = False
        self._shown = 0  # characters of `text` already handed out

    def push(self, token: int) -> str:
        """Add a token; returns the text that became printable."""
        if self.stopped:
            return ""
        self.ids.append(token)
        text = self._decode(self.ids)
        cut = self._first_stop(text)
        if cut is not None:
            self.text, self.stopped = text[:cut], True
            return self._take(cut)
        self.text = text
        return self._take(self._safe_end(text))

    def flush(self) -> str:
        """The rest of the text, once the reply has ended without a stop string."""
        return self._take(len(self.text))

    def _take(self, end: int) -> str:
        piece = self.text[self._shown : end] if end > self._shown else ""
        self._shown = max(self._shown, end)
        return piece

    def _first_stop(self, text: str) -> int | None:
        # Only the new tail can hold a stop string that was not there before.
        found = [i for s in self.stops if (i := text.find(s, max(0, self._shown - len(s)))) >= 0]
        return min(found) if found else None

    def _safe_end(self, text: str) -> int:
        end = len(text)
        while end > self._shown and text[end - 1] == "\ufffd":  # an incomplete character
            end -= 1
        hold = 0  # the longest tail that may still become a stop string waits
        for s in self.stops:
            for n in range(min(len(s) - 1, end - self._shown), hold, -1):
                if text[end - n : end] == s[:n]:
                    hold = n
                    break
        return end - hold
