"""Server-sent events: the events of an OpenAI stream, read as the specification says.

An event is a block of lines ended by a blank line; a line ends with CRLF, LF or CR; a line that
starts with `:` is a comment; `data:` lines (the value after one optional space) join with
newlines into the event's data; other fields (`event`, `id`, `retry`) are not needed to read an
answer. Bytes arrive in any chunks, a line ending (CR then LF) split between two of them
included. Each byte is looked at once: a line is joined only when its end arrives, never again
with every chunk.
"""

from __future__ import annotations

import re

LINE_END = re.compile(rb"\r\n|\r|\n")


class EventReader:
    """Turn a stream's chunks into the data of its events, as each event completes."""

    __slots__ = ("_after_cr", "_data", "_partial")

    def __init__(self) -> None:
        self._partial: list[bytes] = []  # the start of a line whose end has not arrived
        self._data: list[bytes] = []  # the data lines of the event being read
        self._after_cr = False  # the last chunk ended with CR: a LF next ends nothing more

    def feed(self, chunk: bytes) -> list[bytes]:
        """Return the data of every event the chunk completes."""
        if (
            chunk[-2:] == b"\n\n"
            and chunk[:6] == b"data: "
            and b"\r" not in chunk
            and not (self._partial or self._data or self._after_cr)
        ):
            # What backends send nearly always: whole events of one `data: ` line each, LF-ended.
            blocks = chunk[6:-2].split(b"\n\ndata: ")
            if b"\n" not in b"".join(blocks):
                return blocks
        found: list[bytes] = []
        start = 0
        if self._after_cr and chunk[:1] == b"\n":
            start = 1
        self._after_cr = chunk[-1:] == b"\r"
        for end in LINE_END.finditer(chunk, start):
            piece = chunk[start : end.start()]
            line = b"".join((*self._partial, piece)) if self._partial else piece
            self._partial.clear()
            start = end.end()
            data = self._line(line)
            if data is not None:
                found.append(data)
        if start < len(chunk):
            self._partial.append(chunk[start:])
        return found

    def _line(self, line: bytes) -> bytes | None:
        """Take one line; return the event's data if the line ends an event that has some."""
        if not line:
            if not self._data:
                return None
            data = b"\n".join(self._data)
            self._data.clear()
            return data
        if line[:1] == b":":
            return None  # a comment
        name, _, value = line.partition(b":")
        if name == b"data":  # "data" alone is an empty data line
            self._data.append(value[1:] if value[:1] == b" " else value)
        return None


def events(data: bytes) -> list[bytes]:
    """Return the data of every complete event in a whole stream's bytes."""
    return EventReader().feed(data)
