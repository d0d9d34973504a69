"""onnxruntime's loggers write warnings and errors (coloured, on stderr): a failed run logs its
error before raising it, which qtool then reports in one line. A library does not print: sessions
set FATAL (collect, nchwc, fp16) and the CLI sets it on the default logger (quiet)."""

FATAL = 4  # onnxruntime's severities: 0 verbose, 1 info, 2 warning, 3 error, 4 fatal


def quiet() -> None:
    """Only fatal messages from onnxruntime's default logger, in this process."""
    import onnxruntime as ort

    ort.set_default_logger_severity(FATAL)
