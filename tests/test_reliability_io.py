"""Issue 9, class 2: no lost data and no traceback on writes (and the one error policy of the CLI).

Outputs go to a temporary file beside the target and replace it only when complete; `-` is stdout/stdin; every OS
error is one line naming the path; SIGTERM/SIGHUP clean up like Ctrl-C; two writers of one path: the second
refuses. Real processes are used where the behaviour lives in the OS (closed stdout, /dev/full, a file-size limit
that makes writes fail like a full disk, signals).
"""

from __future__ import annotations

import fcntl
import os
import resource
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from strata_cli.sysio import files, signals
from strata_cli.cli import main
from strata_cli.errors import InputError, StrataError

REPO = Path(__file__).resolve().parent.parent
ROOT = os.geteuid() == 0


def strata(*args, env=None, stdout=subprocess.PIPE, stdin=None, preexec_fn=None, input=None, timeout=120):
    """Run `python -m strata_cli ARGS` in a real process with this checkout first on the path."""
    full_env = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    full_env.pop("STRATA_TRACEBACK", None)
    return subprocess.run([sys.executable, "-m", "strata_cli", *map(str, args)], env=full_env, stdout=stdout,
                          stderr=subprocess.PIPE, stdin=stdin, preexec_fn=preexec_fn, input=input, timeout=timeout)


def one_line(proc, *needles, code=1) -> str:
    err = proc.stderr.decode() if isinstance(proc.stderr, bytes) else proc.stderr
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == code, (proc.returncode, err)
    assert "Traceback" not in err, err
    errors = [line for line in lines if line.startswith("strata: error: ")]
    assert len(errors) == 1, err
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
    return errors[0]


@pytest.fixture
def model(fixture_dir):
    return fixture_dir / "model-f32.gguf"


def no_partials(directory: Path) -> None:
    leftovers = [p.name for p in directory.iterdir() if files.PARTIAL_SUFFIX in p.name]
    assert not leftovers, leftovers


# ---------------------------------------------------------------- the sysio modules themselves

def test_output_stream_replaces_only_when_complete(tmp_path):
    target = tmp_path / "out.tsv"
    target.write_text("old contents\n")
    with pytest.raises(RuntimeError):
        with files.output_stream(target, what="dump") as fh:
            fh.write("half")
            assert files.partial_path(target).exists() and target.read_text() == "old contents\n"
            raise RuntimeError("a crash mid-write")
    assert target.read_text() == "old contents\n"
    no_partials(tmp_path)
    with files.output_stream(target, what="dump") as fh:
        fh.write("new\n")
    assert target.read_text() == "new\n"
    no_partials(tmp_path)


def test_output_stream_interrupt_and_terminate_clean_up(tmp_path):
    target = tmp_path / "out.tsv"
    for exc in (KeyboardInterrupt(), signals.Terminated(signal.SIGTERM), signals.Terminated(signal.SIGHUP)):
        with pytest.raises(KeyboardInterrupt):
            with files.output_stream(target, what="dump") as fh:
                fh.write("x")
                raise exc
        assert not target.exists()
        no_partials(tmp_path)


def test_second_writer_of_one_path_is_refused(tmp_path):
    target = tmp_path / "m.gguf"
    with files.output_path(target, what="model") as tmp:
        tmp.write_bytes(b"first")
        with pytest.raises(InputError, match="another strata process is writing"):
            with files.output_path(target, what="model"):
                pass
    assert target.read_bytes() == b"first"
    no_partials(tmp_path)


def test_stale_partial_of_a_killed_run_is_reused(tmp_path):
    target = tmp_path / "out.tsv"
    files.partial_path(target).write_text("garbage of a SIGKILLed run")
    with files.output_stream(target, what="dump") as fh:
        fh.write("ok\n")
    assert target.read_text() == "ok\n"
    no_partials(tmp_path)


@pytest.mark.parametrize("name,needle", [
    ("missing/dir/out.tsv", "no such directory"),
    ("newdir/", "names a directory"),
    ("", "empty path"),
    ("a" * 300 + ".tsv", "the filesystem allows"),
    (".", "is a directory"),
])
def test_check_output_path(tmp_path, monkeypatch, name, needle):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError) as info:
        files.check_output_path(name, what="dump")
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_partial_name_of_a_long_target_fits(tmp_path):
    target = tmp_path / ("b" * 250)
    assert len(files.partial_path(target).name) <= 255
    with files.output_stream(target, what="dump") as fh:
        fh.write("ok")
    assert target.read_text() == "ok"


def test_devices_and_fifos_are_written_into_not_replaced(tmp_path):
    null = tmp_path / "null"
    try:
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a second /dev/null node, safe to lose
    except PermissionError:
        pytest.skip("mknod needs root")
    with files.output_stream(null, what="dump") as fh:
        fh.write("into the device\n")
    assert stat.S_ISCHR(os.stat(null).st_mode)
    no_partials(tmp_path)
    with pytest.raises(InputError, match="is a character device"):
        with files.output_path(null, what="model"):
            pass
    assert stat.S_ISCHR(os.stat(null).st_mode)


def test_fifo_output_is_streamed(tmp_path):
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo).read()))
    reader.start()
    with files.output_stream(fifo, what="dump") as fh:
        fh.write("rows\n")
    reader.join(10)
    assert got == ["rows\n"] and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_symlinked_output_is_written_through(tmp_path):
    real = tmp_path / "real.tsv"
    real.write_text("old\n")
    link = tmp_path / "link.tsv"
    link.symlink_to(real)
    with files.output_stream(link, what="dump") as fh:
        fh.write("new\n")
    assert link.is_symlink() and real.read_text() == "new\n"
    no_partials(tmp_path)


def test_existing_file_needs_force(tmp_path):
    (tmp_path / "x").write_text("keep")
    with pytest.raises(InputError, match="file exists"):
        files.check_output_path(tmp_path / "x", what="model", force=False)


@pytest.mark.parametrize("kind", ["missing", "dangling", "loop", "fifo", "dir", "notdir", "unreadable_dir"])
def test_input_problems_are_named(tmp_path, kind):
    path = tmp_path / "p"
    if kind == "dangling":
        path.symlink_to(tmp_path / "nowhere")
    elif kind == "loop":
        path.symlink_to(tmp_path / "q")
        (tmp_path / "q").symlink_to(path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    elif kind == "notdir":
        (tmp_path / "f").write_text("x")
        path = tmp_path / "f" / "inside"
    elif kind == "unreadable_dir":
        if ROOT:
            pytest.skip("root searches any directory")
        (tmp_path / "d").mkdir()
        (tmp_path / "d" / "m").write_text("x")
        (tmp_path / "d").chmod(0)
        path = tmp_path / "d" / "m"
    expected = {"missing": "no such file", "dangling": "dangling symbolic link", "loop": "symlink loop",
                "fifo": "FIFO", "dir": "is a directory", "notdir": "not a directory",
                "unreadable_dir": "permission denied"}[kind]
    try:
        problem = files.input_problem(path)
    finally:
        if kind == "unreadable_dir":
            (tmp_path / "d").chmod(0o755)
    assert problem and expected in problem, problem


@pytest.mark.parametrize("data,needle", [
    (b"1 2 \xff 3", "not UTF-8"), (b"1\x002", "binary file"), ("1 2 3".encode("utf-16"), "UTF-16"),
])
def test_read_text_refuses_binary_and_other_encodings(tmp_path, data, needle):
    path = tmp_path / "t.txt"
    path.write_bytes(data)
    with pytest.raises(InputError, match=needle):
        files.read_text(path, what="token file")


def test_read_text_accepts_utf8_bom(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(b"\xef\xbb\xbf1 2 3")
    assert files.read_text(path, what="token file") == "1 2 3"


# ---------------------------------------------------------------- the CLI's one policy

@pytest.mark.parametrize("args", [["--bogus"], ["info", "--x"], ["nosuch"], ["compare"], ["logprobs", "--seed", "x"],
                                  ["logprobs", "--seed", "-1"], ["logprobs", "--draft-noise", "nan"],
                                  ["verify-bench", "--acceptance", "nan"], ["compare", "a", "b", "--min-top1", "nan"],
                                  ["compare", "a", "b", "--max-delta", "inf"], ["make-model", "x", "--seed", "-5"]])
def test_usage_errors_are_one_line_exit_2(args):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("strata: error: "), result.stderr


def test_unexpected_os_error_is_one_line(monkeypatch):
    from strata_cli import cli as cli_module

    def failing():
        raise PermissionError(13, "Permission denied", "/some/file")

    monkeypatch.setitem(cli_module.COMMANDS, "failing", ("__none__", "x"))
    import click

    monkeypatch.setattr(cli_module.LazyGroup, "get_command",
                        lambda self, ctx, name: click.Command(name, callback=failing) if name == "failing" else None)
    result = CliRunner().invoke(main, ["failing"])
    assert result.exit_code == 1
    assert result.stderr.strip() == "strata: error: /some/file: Permission denied"


# ---------------------------------------------------------------- real processes: stdout, disk, signals

@pytest.mark.parametrize("command", [["info"], ["info", "--json"], ["logprobs", "--random", "6"],
                                     ["verify-bench", "--window", "1", "--windows", "1"]])
def test_closed_and_full_stdout_are_one_line(model, command, tmp_cache):
    args = [*command[:1], model, *command[1:]]
    closed = strata(*args, stdout=None, preexec_fn=lambda: os.close(1))
    one_line(closed, "stdout is closed")
    with open("/dev/full", "wb") as full:
        one_line(strata(*args, stdout=full), "stdout", "No space left on device")


def test_compare_and_make_model_on_closed_and_full_stdout(model, tmp_path):
    dump = strata("logprobs", model, "--random", "6", "--device", "cpu")
    (tmp_path / "a.tsv").write_bytes(dump.stdout)
    args = ["compare", tmp_path / "a.tsv", tmp_path / "a.tsv"]
    one_line(strata(*args, stdout=None, preexec_fn=lambda: os.close(1)), "stdout is closed")
    with open("/dev/full", "wb") as full:
        one_line(strata(*args, stdout=full), "stdout", "No space left on device")
        one_line(strata("make-model", tmp_path / "m.gguf", stdout=full), "stdout", "No space left on device")
    assert (tmp_path / "m.gguf").is_file()  # the model itself was written whole; only its summary line failed
    no_partials(tmp_path)


def test_make_model_with_closed_stdout_writes_nothing(tmp_path, tmp_cache):
    one_line(strata("make-model", tmp_path / "m.gguf", stdout=None, preexec_fn=lambda: os.close(1)),
             "stdout is closed")
    assert not (tmp_path / "m.gguf").exists()
    no_partials(tmp_path)


def _file_size_limit(limit):
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG, like a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_failed_write_keeps_the_old_file(model, tmp_path):
    old = tmp_path / "old.tsv"
    old.write_text("# precious\n")
    proc = strata("logprobs", model, "--random", "40", "--topk", "8", "-o", old, "--force", "--device", "cpu",
                  preexec_fn=_file_size_limit(4096))
    one_line(proc, str(old), "cannot write the logprob dump")
    assert old.read_text() == "# precious\n"
    no_partials(tmp_path)


def test_make_model_on_a_full_disk_leaves_nothing(tmp_path):
    proc = strata("make-model", tmp_path / "m.gguf", preexec_fn=_file_size_limit(1 << 20))
    one_line(proc, str(tmp_path / "m.gguf"), "cannot write the model")
    assert not (tmp_path / "m.gguf").exists()
    no_partials(tmp_path)


def default_signals() -> None:
    """The child's SIGINT / SIGHUP / SIGTERM back at their defaults: a test run started in the background of a
    non-interactive shell (`cmd &`) inherits SIGINT ignored, and the child then never sees the signal under test
    (2026-12-03: SIGINT's case failed only when pytest ran as such a job)."""
    for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(s, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_signals_clean_up_make_model(tmp_path, sig):
    out = tmp_path / "m.gguf"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "strata_cli", "make-model", str(out), "--preset", "small",
                             "--layers", "4", "--type", "F32"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=default_signals)
    partial = files.partial_path(out)
    deadline = time.monotonic() + 60
    while not (partial.exists() and partial.stat().st_size > 0) and proc.poll() is None:
        assert time.monotonic() < deadline, "make-model never started writing"
        time.sleep(0.02)
    if proc.poll() is not None:
        pytest.skip("the model was written before the signal could arrive")
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, (proc.returncode, err)
    assert b"Traceback" not in err, err
    assert not out.exists()
    no_partials(tmp_path)


def test_two_make_models_to_one_path(tmp_path):
    out = tmp_path / "m.gguf"
    partial = files.partial_path(out)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # what a running first make-model holds
    try:
        one_line(strata("make-model", out, "--force"), "another strata process is writing")
    finally:
        os.close(fd)
    assert not out.exists()
    done = strata("make-model", out)
    assert done.returncode == 0, done.stderr
    one_line(strata("make-model", out), "file exists")


@pytest.mark.parametrize("name,needle", [("newdir/", "names a directory"), ("no/such/m.gguf", "no such directory"),
                                         ("x" * 260 + ".gguf", "the filesystem allows")])
def test_make_model_bad_out_paths(tmp_path, name, needle):
    result = CliRunner().invoke(main, ["make-model", f"{tmp_path}/{name}"])
    assert result.exit_code == 1 and needle in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("setup", ["file", "missing_parent_file", "bad_home", "unwritable"])
def test_unusable_cache_is_one_line(tmp_path, model, setup):
    if setup == "unwritable" and ROOT:
        pytest.skip("root writes anywhere")
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    env = {"file": {"STRATA_CACHE": str(blocker)},
           "missing_parent_file": {"STRATA_CACHE": "", "XDG_CACHE_HOME": str(blocker / "sub")},
           "bad_home": {"STRATA_CACHE": "", "XDG_CACHE_HOME": "", "HOME": "/proc/no-such-home"},
           "unwritable": {"STRATA_CACHE": str(tmp_path / "ro")}}[setup]
    if setup == "unwritable":
        (tmp_path / "ro").mkdir(mode=0o500)
    line = one_line(strata("info", env=env), "strata cache", "HOME" if setup == "bad_home" else "")
    assert "STRATA_CACHE" in line
    # a MODEL given: the cache is never needed
    assert strata("info", model, env=env).returncode == 0


def test_default_model_checksum_rebuilds_a_same_size_corruption(tmp_cache):
    from strata_cli.synth import default_model

    path = default_model.default_model_path()
    good = path.read_bytes()
    corrupt = bytearray(good)
    corrupt[len(good) // 2] ^= 0xFF
    path.write_bytes(bytes(corrupt))
    assert path.stat().st_size == len(good)
    assert default_model.default_model_path() == path
    assert path.read_bytes() == good


def test_empty_model_argument_is_refused(tmp_cache):
    result = CliRunner().invoke(main, ["info", ""])
    assert result.exit_code == 1 and "empty string" in result.stderr


def test_dash_reads_tokens_and_dumps_from_stdin(model, tmp_path):
    dump = strata("logprobs", model, "--tokens", "-", "--device", "cpu", input=b"1 2 3 4 5\n")
    assert dump.returncode == 0, dump.stderr
    (tmp_path / "a.tsv").write_bytes(dump.stdout)
    cmp = strata("compare", "-", tmp_path / "a.tsv", "--max-delta", "0", input=dump.stdout)
    assert cmp.returncode == 0, cmp.stderr
    one_line(strata("compare", "-", "-", input=dump.stdout), "DUMP_A and DUMP_B are each '-'", code=2)


def test_ascii_only_terminal_gets_the_delta_sign(model, tmp_path):
    dump = strata("logprobs", model, "--random", "6", "--device", "cpu")
    (tmp_path / "a.tsv").write_bytes(dump.stdout)
    proc = strata("compare", tmp_path / "a.tsv", tmp_path / "a.tsv", env={"PYTHONIOENCODING": "ascii"})
    assert proc.returncode == 0, proc.stderr
    assert b"Traceback" not in proc.stderr
