"""User-facing errors: the CLI turns these into a one-line message and exit code 1 (2 for a usage error).

A message that names an option names it by its key, and each front end words it: the command line
as its flag (`--size HxW`, `--runtime openvino`), Python as the keyword (`size=(h, w)`,
`runtime='openvino'`). The message is then a template whose fields are given as keywords: an
`Opt` (an option, with the value given or a placeholder of its kind) or any other value (shown with
str.format, format specs allowed). Text the user gave goes into fields, never into the template:

    raise QtoolError("{size} is not HxW, e.g. {example}", size=Opt("size", text, quoted=True),
                     example=Opt("size", (320, 320)))

A message without fields is the text itself (no formatting). str(error) is Python's wording;
`error.worded(flags)` the command line's, `flags` mapping keys to the flags of the command run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# placeholders of an option's kind that Python writes otherwise (the others are left out: `images=`)
_PYTHON_METAVARS = {"HxW": "(h, w)"}


@dataclass(frozen=True)
class Opt:
    """An option named in a message: its key (the Python keyword), and after its name the value
    given (`value`: a string, a number, or a (height, width) pair) or a placeholder (`metavar`,
    e.g. "HxW", "DIR"; Python writes only `key=` for most). `quoted`: the command line shows the
    value as Python does, quoted (`--size '3x'`), not as typed (`--runtime openvino`)."""

    key: str
    value: object = None
    metavar: str | None = None
    quoted: bool = False

    def worded(self, flag: str | None = None) -> str:
        """`flag value` (the command line's wording) or, with no flag, `key=value` (Python's)."""
        if flag is not None:
            if self.value is None:
                return f"{flag} {self.metavar}" if self.metavar else flag
            return f"{flag} {_typed(self.value, self.quoted)}"
        if self.value is None:
            return f"{self.key}={_PYTHON_METAVARS.get(self.metavar, '')}"
        return f"{self.key}={_python(self.value)}"


def _typed(value, quoted: bool) -> str:
    """A value as it is typed on the command line."""
    if isinstance(value, tuple):
        return "x".join(map(str, value))
    if isinstance(value, float):
        return format(value, "g")
    return repr(value) if quoted else str(value)


def _python(value) -> str:
    """A value as Python writes it."""
    return format(value, "g") if isinstance(value, float) else repr(value)


def opts(*keys: str) -> dict[str, Opt]:
    """Fields naming options without a value: {key: Opt(key)}."""
    return {k: Opt(k) for k in keys}


@dataclass(frozen=True)
class Words:
    """Text that may name options: a template and its fields (an Opt, a Words or QtoolError worded
    as the whole, or any value), e.g. a label such as `Words("a {images} file", images=Opt("images"))`."""

    template: str
    fields: dict = field(default_factory=dict)

    def worded(self, flags: Mapping[str, str] | None = None) -> str:
        """The text with its options named as `flags` names them ({key: flag}; an option not in it:
        --key with dashes), or with no flags as Python keywords."""
        if not self.fields:
            return self.template
        return self.template.format(**{k: _worded(v, flags) for k, v in self.fields.items()})

    def __str__(self) -> str:
        return self.worded()


def _worded(value, flags: Mapping[str, str] | None):
    if isinstance(value, Opt):
        return value.worded(None if flags is None else flags.get(value.key) or "--" + value.key.replace("_", "-"))
    if isinstance(value, (Words, QtoolError)):
        return value.worded(flags)
    return value


class QtoolError(Exception):
    """Bad input or a request qtool cannot satisfy; the message says what to do."""

    def __init__(self, message: str, **fields):
        super().__init__(message)
        self.words = Words(message, fields)

    def worded(self, flags: Mapping[str, str] | None = None) -> str:
        """The message as the command line words it (`flags`: {key: flag}) or, with no flags, Python."""
        return self.words.worded(flags)

    def __str__(self) -> str:
        return self.worded()

    def __reduce__(self):  # pickled with its fields (the default would keep the template alone)
        return _remade, (type(self), self.words.template, self.words.fields)


def _remade(cls, template: str, fields: dict) -> QtoolError:
    return cls(template, **fields)


class UsageError(QtoolError):
    """A request that does not make sense as given (the command line: a usage error, exit 2)."""
