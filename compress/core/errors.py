"""The one exception type that reaches the user as a single line."""


class CompressError(Exception):
    """A problem with the user's input or environment, not a bug.

    The message says what was wrong and what to do; the CLI prints it as one line
    on stderr and exits with status 2, without a traceback.
    """

    exit_code = 2

    def __init__(self, message: str):
        # Keep it to one line: the CLI prints str(error) verbatim.
        super().__init__(" ".join(str(message).split()))
