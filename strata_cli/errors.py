"""User-facing errors: one line, naming the file / key / tensor / value at fault."""


class StrataError(Exception):
    """A problem with the user's input. The CLI prints it as one line and exits non-zero."""


class ModelFileError(StrataError):
    """The GGUF file is unreadable, truncated, of the wrong architecture or inconsistent."""


class InputError(StrataError):
    """Bad tokens, windows or options given on the command line."""


class DeviceUnavailable(StrataError):
    """The requested device (GPU) is not usable here."""
