"""Arrow string arrays read as numpy views of their buffers.

Only pyarrow's core: ``pyarrow.compute`` and ``Array.to_numpy`` import pandas on first
use (0.4 s of every tokenize job, measured here), which buys nothing on these columns.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# The first bytes of the UTF-8 of every character Python's str.isspace() counts as
# whitespace (the ASCII ones, U+0085, U+00A0, U+1680, U+2000-U+3000's; tests/text check
# the list against Python's): a text whose first byte is none of them does not start
# with whitespace.
SPACE_LEAD_BYTES = (9, 10, 11, 12, 13, 28, 29, 30, 31, 32, 0xC2, 0xE1, 0xE2, 0xE3)
_SPACE_LEAD = np.zeros(256, dtype=bool)
_SPACE_LEAD[list(SPACE_LEAD_BYTES)] = True


def utf8_offsets(texts: Any) -> np.ndarray:
    """A string array's ``len + 1`` offsets into its data buffer, as int64."""
    import pyarrow as pa

    width = np.int32 if pa.types.is_string(texts.type) else np.int64
    start = texts.offset
    return np.frombuffer(texts.buffers()[1], width)[start : start + len(texts) + 1].astype(np.int64)


def utf8_data(texts: Any) -> np.ndarray:
    """A string array's data buffer (all of it: the offsets index into it)."""
    data = texts.buffers()[2]
    return np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)


def blank(texts: Any, offsets: np.ndarray) -> np.ndarray:
    """Which texts are empty or whitespace only (``not t or t.isspace()``): only those
    whose first character is whitespace become Python strings."""
    out = np.diff(offsets) == 0
    data = utf8_data(texts)
    rows = np.flatnonzero(~out)
    for k in rows[_SPACE_LEAD[data[offsets[rows]]]]:
        first = bytes(data[offsets[k] : offsets[k] + 4]).decode("utf-8", "replace")[0]
        if first.isspace():
            out[k] = texts[int(k)].as_py().isspace()
    return out
