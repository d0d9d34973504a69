"""User-facing errors: the CLI turns these into a one-line message and exit code 1 (2 for a usage error)."""


class QtoolError(Exception):
    """Bad input or a request qtool cannot satisfy; the message says what to do."""


class UsageError(QtoolError):
    """A request that does not make sense as given (the command line: a usage error, exit 2)."""
