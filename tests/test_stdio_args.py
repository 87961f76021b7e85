"""`-` for every file argument and option of every command (README "Commands": stdin/stdout wherever a file is read
or written, or one refusal line, exit 2), two `-` readers refused, and outputs into missing or read-only folders.

The cases are enumerated from the click command tree: every parameter typed commands._common.FileParam is tried, so
a new file option is covered as soon as it exists; test_every_file_parameter_is_a_file_param keeps a new str option
from escaping that (it must be a FileParam or be named in NOT_FILES)."""

from __future__ import annotations

import ctypes
import itertools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from test_reliability_values import error_line

from strata_cli.cli import main
from strata_cli.commands._common import STDIN, STDOUT, FileParam

REPO = Path(__file__).resolve().parent.parent

# str parameters that name no file (a value, a list, a size): anything else of type str must be a FileParam
NOT_FILES = {"text", "window_list", "expert_cache", "expert_max_copy", "pcie_frac", "slots", "policies", "max_copy",
             "gpus", "layer_split"}


def commands():
    ctx = click.Context(main)
    return {name: main.get_command(ctx, name) for name in main.list_commands(ctx)}


def file_params():
    return [(name, p) for name, cmd in commands().items() for p in cmd.params if isinstance(p.type, FileParam)]


def case_id(name, param):
    return f"{name}:{param.opts[0] if isinstance(param, click.Option) else param.human_readable_name}"


FILE_CASES = {case_id(n, p): (n, p.name) for n, p in file_params()}
def param_of(command: str, name: str):
    return next(p for p in commands()[command].params if p.name == name)


def test_every_file_parameter_is_a_file_param():
    for name, cmd in commands().items():
        for p in cmd.params:
            if isinstance(p.type, click.Path):
                assert isinstance(p.type, FileParam), f"{name} {p.name}: a click.Path, not a FileParam"
            elif isinstance(p.type, click.types.StringParamType):
                assert p.name in NOT_FILES, (f"{name} {p.name}: a str parameter: type it FileParam(STDIN|STDOUT, "
                                             "...) if it names a file, else add it to NOT_FILES")
    assert len(FILE_CASES) >= 40  # every command's model, inputs and outputs


@pytest.fixture(scope="module")
def inputs(fixture_dir, tmp_path_factory):
    """The files a base run of each command reads, and what `-` gets on stdin for each parameter."""
    d = tmp_path_factory.mktemp("stdio")
    model = fixture_dir / "model-f32.gguf"

    def run(*args):
        result = CliRunner().invoke(main, [str(a) for a in args])
        assert result.exit_code == 0, result.output

    run("make-profile", model, "--random", 16, "-o", d / "p.yaml", "--trace", d / "t.npz")
    run("logprobs", model, "--random", 6, "--device", "cpu", "-o", d / "d.tsv")
    run("logprobs", model, "--random", 9, "--device", "cpu", "--window", 4, "--draft-noise", 0.3, "-o", d / "s.tsv")
    files = {"model": model, "profile": d / "p.yaml", "trace": d / "t.npz", "dump": d / "d.tsv"}
    tokens = " ".join(str(i % 500 + 1) for i in range(40)).encode() + b"\n"  # verify-bench needs depth + window
    stdin = {"token_file": tokens, "text_file": b"hello world, " * 20, ("make-profile", "holdout"): tokens,
             ("profile-info", "holdout"): tokens,  # README: a profile by its suffix, else (and `-`) token ids
             "preset": (REPO / "profiles" / "presets" / "tiny.yaml").read_bytes(), "recipe": b"default: Q8_0\n",
             "expert_profile": files["profile"].read_bytes(), "holdout": files["profile"].read_bytes(),
             "profile_path": files["profile"].read_bytes(), "trace_path": files["trace"].read_bytes(),
             "dump_a": files["dump"].read_bytes(), "dump_b": files["dump"].read_bytes(),
             "acceptance_dump": (d / "s.tsv").read_bytes()}
    return files, stdin


def base_args(command: str, files: dict, out: Path) -> list:
    """A run of `command` that succeeds (on a GPU for the GPU-only ones) with files and outputs under `out`."""
    m = files["model"]
    cpu = ["--device", "cpu"]
    return {
        "info": [m], "make-model": [out / "m.gguf"], "quantize": [m, out / "q.gguf", "--type", "Q8_0"],
        "logprobs": [m, "--random", 4, *cpu, "-o", out / "d.tsv"], "compare": [files["dump"], files["dump"]],
        "compare-models": [m, m, "--random", 4, *cpu],
        "verify-bench": [m, *cpu, "-r", 1, "--window", 1, "--warmup", 0],
        "make-profile": [m, "--random", 8, "-o", out / "p.yaml"], "profile-info": [files["profile"], m],
        "cache-sim": [files["trace"], "--slots", 4], "graph-nodes": [m], "stall-test": [m], "profile": [m],
    }[command]


def with_value(command: str, args: list, name: str, value) -> list:
    """args with parameter `name` of `command` set to value: a positional replaced (or appended), an option's value
    replaced or the option added; a token source replaces --random."""
    cmd = commands()[command]
    param = param_of(command, name)
    args = list(args)
    if isinstance(param, click.Argument):
        index = [p.name for p in cmd.params if isinstance(p, click.Argument)].index(name)
        if index < len(args):
            args[index] = value
        else:
            args.append(value)
        return args
    replaced = {"token_file": "--random", "text_file": "--random", "recipe": "--type"}.get(name)
    if replaced in args:  # the one option this one excludes
        i = args.index(replaced)
        del args[i:i + 2]
    for opt in param.opts:
        if opt in args:
            args[args.index(opt) + 1] = value
            return args
    return args + [param.opts[0], value]


def invoke(command, args, stdin=b""):
    return CliRunner().invoke(main, [command, *map(str, args)], input=stdin)


def no_gpu() -> bool:
    from strata_cli.engine import gpu_probe

    return gpu_probe()[1] is not None


@pytest.mark.parametrize("case", sorted(FILE_CASES))
def test_dash_reads_stdin_writes_stdout_or_is_refused(case, inputs, tmp_path):
    """`-` for this file parameter: the command reads stdin / writes stdout as the README says, or refuses `-` in
    one line (exit 2) naming the parameter and why."""
    files, stdin = inputs
    command, name = FILE_CASES[case]
    ftype = param_of(command, name).type
    args = with_value(command, base_args(command, files, tmp_path), name, "-")
    if ftype.refused:
        line = error_line(invoke(command, args), 2, f"'-' ({ftype.stdio}) is not supported", ftype.refused)
        assert "'-'" in line
        assert list(tmp_path.iterdir()) == []  # nothing written
        return
    if ftype.stdio == STDIN:
        content = stdin.get((command, name), stdin.get(name))
        assert content is not None, f"{case}: say what `-` gets on stdin in the inputs fixture"
        result = invoke(command, args, content)
    else:
        result = invoke(command, args)
    if result.exit_code == 1 and "runs on the GPU only" in result.stderr and no_gpu():
        error_line(result, 1, "runs on the GPU only")  # the command cannot run here; its `-` parses
        return
    assert result.exit_code == 0, (case, result.output)
    if ftype.stdio == STDOUT:
        assert result.stdout.strip(), case
        assert not (Path.cwd() / "-").exists()


def stdin_readers():
    out = []
    for name, cmd in commands().items():
        readers = [p.name for p in cmd.params if isinstance(p.type, FileParam) and p.type.stdio == STDIN
                   and not p.type.refused]
        out += [(name, a, b) for a, b in itertools.combinations(readers, 2)]
    return out


@pytest.mark.parametrize("command, a, b", stdin_readers())
def test_two_stdin_readers_are_one_usage_error(command, a, b, inputs, tmp_path):
    files, _ = inputs
    args = with_value(command, with_value(command, base_args(command, files, tmp_path), a, "-"), b, "-")
    error_line(invoke(command, args, b"1 2 3\n"), 2, "are each '-'", "only one argument can read stdin")


def test_every_command_has_a_stdin_case():
    assert {command for command, _ in FILE_CASES.values()} == set(commands())
    assert len(stdin_readers()) >= 10


# ---------------------------------------------------------------- outputs into missing or read-only folders

OUTPUT_NAMES = {"make-model": "m.gguf", "quantize": "q.gguf", "logprobs": "d.tsv", "make-profile": "p.yaml"}


def output_cases():
    """Every file output (a FileParam of stdout) with a file name it accepts."""
    cases = []
    for command, p in file_params():
        if p.type.stdio == STDOUT:
            name = "t.npz" if p.name == "trace_path" else OUTPUT_NAMES[command]
            cases.append((command, p.name, name))
    return cases


def test_every_output_is_covered():
    assert {(c, n) for c, n, _ in output_cases()} >= {("make-model", "out"), ("quantize", "out"),
                                                       ("logprobs", "output"), ("make-profile", "output"),
                                                       ("make-profile", "trace_path")}


@pytest.mark.parametrize("command, name, filename", output_cases())
def test_output_into_a_missing_folder(command, name, filename, inputs, tmp_path):
    files, _ = inputs
    target = tmp_path / "no" / "such" / filename
    (tmp_path / "other").mkdir()  # the command's other outputs
    args = with_value(command, base_args(command, files, tmp_path / "other"), name, target)
    line = error_line(invoke(command, args), 1)
    assert str(tmp_path / "no") in line, line
    assert not (tmp_path / "no").exists() and list((tmp_path / "other").iterdir()) == []


def _drop_dac_preexec():
    """In the child: drop CAP_DAC_OVERRIDE (1) and CAP_DAC_READ_SEARCH (2) from the bounding set; root's
    capabilities after exec are limited to it, so mode bits bind the child as they bind any user."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def unprivileged(argv: list[str], **kwargs):
    """argv run without the DAC override capabilities (setpriv, else prctl in a preexec_fn)."""
    setpriv = shutil.which("setpriv")
    if setpriv:
        argv = [setpriv, "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search", *argv]
        return subprocess.run(argv, **kwargs)
    return subprocess.run(argv, preexec_fn=_drop_dac_preexec, **kwargs)


@pytest.fixture
def read_only_dir(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    try:
        probe = unprivileged([sys.executable, "-c", f"open({str(d / 'x')!r}, 'w')"], capture_output=True)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot run a child without CAP_DAC_OVERRIDE here: {exc}")
    if probe.returncode == 0:
        (d / "x").unlink()
        pytest.skip("a child without CAP_DAC_OVERRIDE still writes into a mode-555 folder here (no capability "
                    "model, e.g. a user namespace): the read-only case cannot be made")
    yield d
    d.chmod(0o755)


@pytest.mark.parametrize("command, name, filename", output_cases())
def test_output_into_a_read_only_folder(command, name, filename, inputs, read_only_dir, tmp_path):
    files, _ = inputs
    target = read_only_dir / filename
    (tmp_path / "other").mkdir()  # the command's other outputs
    args = with_value(command, base_args(command, files, tmp_path / "other"), name, target)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("STRATA_TRACEBACK", None)
    proc = unprivileged([sys.executable, "-m", "strata_cli", command, *map(str, args)], capture_output=True, text=True,
                        env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("strata: error: ")]
    assert len(errors) == 1 and str(read_only_dir) in errors[0], proc.stderr
    assert list(read_only_dir.iterdir()) == [] == list((tmp_path / "other").iterdir())  # no file, no .partial
