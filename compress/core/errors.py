"""The one exception type that reaches the user as a single line, and a library's message made into that line."""

import re


class CompressError(Exception):
    """A problem with the user's input or environment, not a bug.

    The message says what was wrong and what to do; the CLI prints it as one line
    on stderr and exits with status 2, without a traceback.
    """

    exit_code = 2

    def __init__(self, message: str):
        # Keep it to one line: the CLI prints str(error) verbatim.
        super().__init__(" ".join(str(message).split()))


# A line that only locates the C++ code that rethrew (OpenVINO: "Exception from src/inference/src/cpp/core.cpp:132:").
_LOCATION_ONLY = re.compile(r"^Exception from \S+:\d+:?$")
FOREIGN_CHARS = 2000  # a library's message is passed on up to this many characters


def foreign(err: BaseException) -> str:
    """A library's or runtime's message for ``err`` whole, as the text of one line ("" when it has none).

    Runtimes raise multi-line messages whose first line may say nothing (OpenVINO's is where its C++ code rethrew);
    every line that says something is kept, in order, joined by spaces (lines that only locate a rethrow are left out).
    """
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    text = " ".join(line for line in lines if not _LOCATION_ONLY.match(line)) or " ".join(lines)
    return text if len(text) <= FOREIGN_CHARS else text[:FOREIGN_CHARS] + " ..."


def reason(err: BaseException) -> str:
    """:func:`foreign`, or the exception's type name when it says nothing: what goes after "because" in a message."""
    return foreign(err) or type(err).__name__
