"""User-facing errors: the CLI turns these into a one-line message and exit code 1."""


class QtoolError(Exception):
    """Bad input or a request qtool cannot satisfy; the message says what to do."""
