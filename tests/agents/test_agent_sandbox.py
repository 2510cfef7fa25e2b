"""The Python sandbox: escapes refused (network, the host's UNIX sockets, files outside the system
directories, writes outside, fork bomb, memory, CPU, the parent's environment), nothing left
behind, output capped, and the positive controls that show each refusal is the sandbox's doing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import uuid
import warnings
from pathlib import Path

import pytest

from glassrl.agents import sandbox
from glassrl.agents.sandbox import Isolation, PythonTool, SandboxLimits, _run, isolation, run_python
from glassrl.errors import GlassrlError

ISO = isolation()
needs_namespaces = pytest.mark.skipif(not ISO.namespaces, reason=f"no namespaces here: {ISO.note}")
needs_tmp_uid = pytest.mark.skipif(not ISO.tmp_uid, reason="not root: the code runs as the caller's uid")
needs_fs = pytest.mark.skipif("fs" not in ISO.guarantees, reason=f"no read-only mount namespace: {ISO}")
FAST = SandboxLimits(wall_s=20.0, cpu_s=5)
# The same program run with no namespaces, under the same uid: the control that shows the sandbox refused.
UNSANDBOXED = Isolation(namespaces=False, tmp_uid=ISO.tmp_uid, python=ISO.python)


def test_runs_code_in_a_fresh_directory_that_is_removed():
    code = "import os\nopen('out.txt', 'w').write('kept')\nprint(open('out.txt').read(), os.getcwd())"
    result = run_python(code, FAST)
    assert result.status == "ok" and result.exit_code == 0
    assert result.stdout.split() == ["kept", result.workdir]
    assert result.workdir.startswith("/") and not Path(result.workdir).exists()
    assert set(ISO.guarantees) <= set(result.guarantees) and "rlimits" in result.guarantees


def test_errors_and_exit_codes_are_reported_not_raised():
    result = run_python("import sys\nprint('partial')\nsys.exit(3)", FAST)
    assert (result.status, result.exit_code, result.stdout) == ("error", 3, "partial\n")
    result = run_python("1/0", FAST)
    assert result.status == "error" and "ZeroDivisionError" in result.stderr


@needs_namespaces
def test_network_is_unreachable_even_to_a_listening_socket_on_this_host():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5):  # control: reachable from here
            pass
        code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=5)\nprint('connected')"
        result = run_python(code, FAST)
    assert result.status == "error" and "connected" not in result.stdout
    assert "OSError" in result.stderr or "ConnectionRefusedError" in result.stderr
    assert "net" in result.guarantees


def _unix_address(where: str) -> str:
    name = f"glassrl-test-{uuid.uuid4().hex}"
    return {"tmp": f"/tmp/{name}.sock", "dev-shm": f"/dev/shm/{name}.sock", "abstract": f"\0{name}"}[where]


@needs_fs
@pytest.mark.parametrize("where", ["tmp", "dev-shm", "abstract"])
def test_a_host_unix_socket_is_unreachable_even_one_anybody_may_connect_to(where):
    """X11, D-Bus, /dev/log, a dev server: a listener on a 0777 socket file (a network namespace
    does not scope those) or in the abstract namespace (it does)."""
    if where == "dev-shm" and not os.access("/dev/shm", os.W_OK):
        pytest.skip("no writable /dev/shm here")
    address = _unix_address(where)
    code = (
        "import socket\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        f"s.connect({address!r})\n"
        "s.sendall(b'escaped')\n"
        "print('connected')\n"
    )
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(address)
        try:
            if not address.startswith("\0"):
                os.chmod(address, 0o777)
            server.listen()
            server.setblocking(False)  # accept(): a connection made is already queued, none is BlockingIOError
            inside = run_python(code, FAST)
            with pytest.raises(BlockingIOError):
                server.accept()
            outside = _run(code, FAST, UNSANDBOXED)  # control: the same program, the same uid, no namespaces
            conn, _ = server.accept()
            with conn:
                conn.setblocking(True)
                received = conn.recv(100)
        finally:
            if not address.startswith("\0"):
                os.unlink(address)
    assert (outside.status, outside.stdout, received) == ("ok", "connected\n", b"escaped")
    assert inside.status == "error" and "connected" not in inside.stdout, inside
    assert "FileNotFoundError" in inside.stderr or "ConnectionRefusedError" in inside.stderr
    assert {"net", "fs", "min-root"} <= set(inside.guarantees)


@needs_fs
def test_world_readable_files_outside_the_system_directories_are_not_visible():
    """A run directory (metrics, ledgers, checkpoints) readable by anybody, and this checkout."""
    run_dir = Path(tempfile.mkdtemp(prefix="glassrl-test-run-"))
    secret = uuid.uuid4().hex
    try:
        run_dir.chmod(0o755)
        (run_dir / "metrics.jsonl").write_text(secret)
        (run_dir / "metrics.jsonl").chmod(0o644)
        paths = [str(run_dir / "metrics.jsonl"), str(Path(__file__).resolve())]
        code = (
            f"for path in {paths!r}:\n"
            "    try:\n"
            "        print('read', len(open(path).read()))\n"
            "    except OSError as err:\n"
            "        print('refused', type(err).__name__)\n"
        )
        inside = run_python(code, FAST)
        outside = _run(code, FAST, UNSANDBOXED)  # control: the same uid reads both where nothing hides them
    finally:
        for path in run_dir.iterdir():
            path.unlink()
        run_dir.rmdir()
    assert outside.status == "ok" and outside.stdout.splitlines()[0] == f"read {len(secret)}"
    assert inside.stdout.splitlines()[0] == "refused FileNotFoundError", inside
    if outside.stdout.splitlines()[1].startswith("read"):  # this checkout is readable by anybody here
        assert inside.stdout.splitlines()[1] == "refused FileNotFoundError", inside
    # what the code needs is there: the standard library, the system's programs
    tools = run_python(
        "import json, subprocess\nprint(subprocess.run(['echo', 'ok'], capture_output=True).stdout)", FAST
    )
    assert tools.status == "ok" and tools.stdout == "b'ok\\n'\n", tools


@needs_tmp_uid
def test_cannot_write_into_a_directory_of_the_parent(tmp_path):
    target = tmp_path / "escape.txt"  # pytest's tmp_path: root's, mode 0700
    for iso in (ISO, UNSANDBOXED):  # the uid of its own refuses it even where nothing hides the directory
        result = _run(f"open({str(target)!r}, 'w').write('x')", FAST, iso)
        assert result.status == "error" and not target.exists()
        if "min-root" in result.guarantees:  # the directory is not in the sandbox's root
            assert "FileNotFoundError" in result.stderr
        else:
            assert "PermissionError" in result.stderr or "Read-only file system" in result.stderr


@needs_fs
def test_the_whole_filesystem_is_read_only_even_world_writable_tmp():
    target = Path("/tmp") / f"glassrl-escape-{uuid.uuid4().hex}"
    result = run_python(f"open({str(target)!r}, 'w').write('x')", FAST)
    assert result.status == "error" and "Read-only file system" in result.stderr
    assert not target.exists()


@needs_namespaces
def test_only_its_own_processes_are_visible():
    code = "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))"
    inside, outside = run_python(code, FAST), _run(code, FAST, UNSANDBOXED)
    assert os.getpid() in json.loads(outside.stdout)  # control: unsandboxed, this test's process is in view
    assert inside.status == "ok" and "pid" in inside.guarantees
    seen = json.loads(inside.stdout)
    assert os.getpid() not in seen and seen[0] == 1  # its first process is the namespace's init


def test_the_parents_environment_is_not_visible(monkeypatch):
    secret = uuid.uuid4().hex
    monkeypatch.setenv("GLASSRL_TEST_SECRET", secret)
    code = (
        "import os\n"
        "print(sorted(os.environ))\n"
        f"for pid in ('1', str(os.getppid()), {str(os.getpid())!r}):\n"
        "    try:\n"
        "        print(open(f'/proc/{pid}/environ', 'rb').read())\n"
        "    except OSError as err:\n"
        "        print('refused', pid, type(err).__name__)\n"
    )
    result = run_python(code, FAST)
    assert result.status == "ok"
    assert secret not in result.stdout and secret not in result.stderr
    assert result.stdout.splitlines()[0] == "['HOME', 'LANG', 'PATH', 'PYTHONIOENCODING']"
    if ISO.tmp_uid:  # the test process's own environ: another uid may not read it
        assert f"refused {os.getpid()}" in result.stdout


def test_memory_hog_fails_inside_its_limit():
    result = run_python("x = bytearray(1 << 30)\nprint('allocated')", SandboxLimits(memory_bytes=256 << 20))
    assert result.status == "error" and "MemoryError" in result.stderr and "allocated" not in result.stdout


def test_infinite_loop_is_stopped():
    result = run_python("while True:\n    pass", SandboxLimits(wall_s=10.0, cpu_s=1))
    # The CPU limit (SIGXCPU) or, on a machine too busy to give it a second of CPU, the wall clock.
    assert result.status == "timeout" or "SIGXCPU" in result.message or "SIGKILL" in result.message


@needs_tmp_uid
def test_fork_bomb_stops_at_the_process_limit_and_leaves_nothing():
    marker = 900000 + os.getpid() % 99999  # `sleep <marker>` identifies this test's processes
    code = (
        "import os, subprocess\n"
        f"subprocess.Popen(['sleep', '{marker}'], start_new_session=True)\n"
        "count = 0\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        f"            os.execv('/bin/sleep', ['sleep', '{marker}'])\n"
        "        count += 1\n"
        "except OSError as err:\n"
        "    print('stopped after', count, type(err).__name__)\n"
    )
    result = run_python(code, SandboxLimits(wall_s=20.0, processes=8))
    assert result.status == "ok", result
    assert int(result.stdout.split()[2]) < 8  # RLIMIT_NPROC, not the wall clock, stopped it
    alive = subprocess.run(["pgrep", "-f", f"^sleep {marker}$"], capture_output=True, text=True).stdout
    assert alive == ""  # the detached sleeper and the forks were all killed


def test_timeout_kills_the_process_group_and_leaves_nothing():
    marker = 800000 + os.getpid() % 99999
    code = (
        f"import subprocess\nsubprocess.Popen(['sleep', '{marker}'], start_new_session=True)\n"
        "import time\ntime.sleep(60)"
    )
    result = run_python(code, SandboxLimits(wall_s=2.0))
    assert result.status == "timeout" and result.exit_code is None
    alive = subprocess.run(["pgrep", "-f", f"^sleep {marker}$"], capture_output=True, text=True).stdout
    if ISO.tmp_uid or ISO.namespaces:
        assert alive == ""


def test_output_is_capped():
    result = run_python("print('x' * 100000)", SandboxLimits(output_bytes=1000))
    assert result.status == "ok" and result.truncated and len(result.stdout) == 1000


def test_python_tool_reports_status_and_output():
    tool = PythonTool(FAST)
    assert tool.call({"code": "print(6 * 7)"}) == "42\n"
    text = tool.call({"code": "raise ValueError('bad input')"})
    assert "ValueError: bad input" in text and "[error: exit code 1]" in text


@pytest.mark.parametrize("field", ["wall_s", "cpu_s", "memory_bytes", "processes", "output_bytes"])
def test_limits_must_be_positive(field):
    with pytest.raises(GlassrlError, match=field):
        SandboxLimits(**{field: 0})


@needs_tmp_uid
def test_concurrent_runs_get_a_uid_each():
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        # _run: past run_python's one run per usable core, so that four do run at once
        code = "import os, time; print(os.getuid()); time.sleep(1)"
        results = list(pool.map(lambda _: _run(code, FAST, ISO), range(4)))
    assert all(r.status == "ok" for r in results)
    uids = {int(r.stdout) for r in results}
    assert len(uids) == 4 and all(uid >= 1_000_000 for uid in uids)


def test_without_namespaces_the_run_still_works_and_says_so():
    """The fallback of a machine where ``unshare`` fails (an unprivileged container), forced here."""
    fallback = UNSANDBOXED
    marker = 700000 + os.getpid() % 99999
    code = f"import subprocess\nsubprocess.Popen(['sleep', '{marker}'], start_new_session=True)\nprint('ran')"
    result = _run(code, FAST, fallback)
    assert result.status == "ok" and result.stdout == "ran\n"
    assert not {"net", "fs", "pid"} & set(result.guarantees)
    alive = subprocess.run(["pgrep", "-f", f"^sleep {marker}$"], capture_output=True, text=True).stdout
    if ISO.tmp_uid:  # every process of the run's uid is killed, the detached one too
        assert alive == ""
    else:  # best effort: a setsid'd process outlives the run (the docstring says so); end it by its id
        for pid in alive.split():
            os.kill(int(pid), 9)


def test_the_python_tool_warns_when_it_runs_code_unsandboxed(monkeypatch):
    """A run that builds the python tool where namespaces fail is told so, once, at start."""
    fallback = Isolation(namespaces=False, tmp_uid=False, python=ISO.python, note="unshare: Operation not permitted")
    monkeypatch.setattr(sandbox, "isolation", lambda: fallback)
    with pytest.warns(
        RuntimeWarning,
        match="without tmp-uid, net, pid, ipc, uts, fs, min-root, seccomp, keyring .*unshare: Operation not permitted",
    ):
        PythonTool(FAST)
    complete = Isolation(namespaces=True, tmp_uid=True, python=ISO.python, seccomp=True)
    monkeypatch.setattr(sandbox, "isolation", lambda: complete)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PythonTool(FAST)
