"""User-facing errors: one line, naming the file / key / tensor / value at fault, and the exit codes.

Exit codes (README "Exit codes"): 0 success; 1 an error (bad input, bad model, an OS error, out of memory);
2 a usage error (unknown option or command, a bad option value); 3 `compare` thresholds missed;
4 non-finite values (a window's logits, or a dump given to `compare`); 128 + N killed by signal N
(130 Ctrl-C, 129 SIGHUP, 143 SIGTERM, 135 SIGBUS: the model file changed while memory-mapped).
"""

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_THRESHOLD = 3
EXIT_NONFINITE = 4
EXIT_INTERRUPTED = 130


class StrataError(Exception):
    """A problem with the user's input. The CLI prints it as one line and exits `exit_code`."""

    exit_code = EXIT_ERROR


class ModelFileError(StrataError):
    """The GGUF file is unreadable, truncated, of the wrong architecture or inconsistent."""


class InputError(StrataError):
    """Bad tokens, windows or options given on the command line."""


class DeviceUnavailable(StrataError):
    """The requested device (GPU) is not usable here."""


class NonFiniteError(StrataError):
    """A window produced NaN/Inf (or a dump holds them): names the first layer/stage where it appeared."""

    exit_code = EXIT_NONFINITE


class OptionError(InputError):
    """A bad option value (out of range, malformed list, a type the command cannot write): a usage error, exit 2."""

    exit_code = EXIT_USAGE
