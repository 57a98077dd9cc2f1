"""Run sweep jobs, each in a process of its own, with a time limit and a memory cap.

A *zygote* (``python -m hf_exporters.sweep.runner``) imports torch, transformers and the exporters
once, then forks one child per job it reads on stdin. The child runs :func:`~.job.run_job` and writes
its record to a file; the zygote waits with the time limit, watches the child's resident memory, and
kills its process group on a timeout or past the memory cap. It answers one JSON line per job, so a
crash, a hang or an out-of-memory is recorded as such and never takes another job with it.

The sweep process keeps ``--jobs N`` zygotes (or sends jobs to Ray workers, each running a zygote for
one job), appends each record to ``results.jsonl`` as it arrives (one line, flushed), and on a rerun
skips the jobs already done under the same library versions and code revision.

Lifetimes: a zygote dies with the sweep process that started it and a job's child with its zygote
(``PR_SET_PDEATHSIG`` on Linux, and a check of the parent's pid before anything is written), so a
sweep killed by SIGTERM, SIGINT or even SIGKILL leaves no job running and no record of a job it did
not see end. A job is recorded as ``oom`` only when the runner's own memory cap killed it; a job
killed by anyone else is a ``crash`` naming the signal.

The output folder (:func:`claim_output`): a sweep writes only into a missing or empty folder or one
holding nothing but a sweep's own files (:data:`SWEEP_FILES`), deletes nothing in it, and holds an
exclusive lock on it (``.sweep.lock``) for its whole run, so two sweeps never write the same folder.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

DEFAULT_TIMEOUT = 90.0
DEFAULT_MEMORY_GB = 6.0
_HEAVY_MODULES = (
    "torch",
    "transformers",
    "hf_exporters.exporters.dynamo",
    "hf_exporters.exporters.onnx",
    "hf_exporters.runtime.compare",
    "transformers.exporters",
    "onnxruntime",
    "onnx_ir",
)
#: imported by the zygote too when a run has ExecuTorch jobs (each fork then starts with them loaded)
_EXECUTORCH_MODULES = (
    "hf_exporters.exporters.executorch",
    "executorch.exir",
    "executorch.backends.xnnpack.partition.xnnpack_partitioner",
    "executorch.runtime",
)
#: environment variable naming the extra modules a zygote imports (comma-separated)
PRELOAD_ENV = "HF_EXPORTERS_SWEEP_PRELOAD"
#: environment variable holding the pid of the sweep process that started a zygote
PARENT_ENV = "HF_EXPORTERS_SWEEP_PARENT"


# ── Process lifetimes ────────────────────────────────────────────────────────


def signal_label(number: int) -> str:
    """``9 (SIGKILL)``; the bare number for a signal Python has no name for (a real-time signal)."""
    try:
        return f"{number} ({signal.Signals(number).name})"
    except ValueError:
        return str(number)


def _die_with_parent(sig: int) -> None:
    """Ask the kernel to send ``sig`` to this process when the thread that forked it ends (Linux only)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return  # no C library to ask: the job still checks os.getppid() before it writes anything
    libc.prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG


# ── Output folder: what a sweep may write into, and one sweep at a time ─────

#: the lock file a running sweep holds in its output folder (it holds the sweep's pid; removed at the end)
LOCK_NAME = ".sweep.lock"
#: every file a sweep writes into its output folder
SWEEP_FILES = ("results.jsonl", "runs.jsonl", "summary.json", "report.md", "pass_rates.png", LOCK_NAME)


class OutputFolderError(Exception):
    """The output folder cannot take this sweep (the message is the user-facing line, without ``error:``)."""


def _first_json_line(path: Path) -> Any:
    """The first complete line of a JSON-lines file, parsed; ``{}`` when it has none (empty, or cut by a kill)."""
    with open(path, "rb") as handle:
        line = handle.readline(1 << 20)
    if not line.endswith(b"\n"):
        return {}
    try:
        return json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def _is_sweep_file(path: Path) -> bool:
    """Whether ``path`` (named as one of :data:`SWEEP_FILES`) is a regular file a sweep could have written."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        if path.name == LOCK_NAME:
            text = path.read_text().strip() if path.stat().st_size <= 32 else "-"
            return text == "" or text.isdigit()
        if path.name == "pass_rates.png":
            with open(path, "rb") as handle:
                return handle.read(8) == b"\x89PNG\r\n\x1a\n"
        if path.name == "report.md":
            with open(path, encoding="utf-8", errors="replace") as handle:
                return "Generated by `hf-exporters sweep`" in handle.read(4096)
        if path.name == "summary.json":
            summary = json.loads(path.read_text())
            return isinstance(summary, dict) and "groups" in summary
        first = _first_json_line(path)
        field = "key" if path.name == "results.jsonl" else "command"
        return isinstance(first, dict) and (not first or field in first)
    except (OSError, ValueError):
        return False


def foreign_entry(folder: Path) -> str | None:
    """The first entry of ``folder`` (sorted; a folder's first file, ``name/`` for an empty one) that a
    sweep does not write, or None when the folder holds nothing but a sweep's own files."""
    folder = Path(folder)
    for entry in sorted(os.listdir(folder)):
        path = folder / entry
        if entry in SWEEP_FILES and _is_sweep_file(path):
            continue
        if path.is_dir() and not path.is_symlink():
            for root, dirs, files in os.walk(path):
                dirs.sort()
                if files:
                    return Path(root, sorted(files)[0]).relative_to(folder).as_posix()
            return entry + "/"
        return entry
    return None


class OutputLock:
    """The exclusive lock a sweep holds on its output folder (:func:`claim_output`); ``release`` ends it."""

    def __init__(self, folder: Path, fd: int):
        self.folder = folder
        self.fd: int | None = fd

    def release(self) -> None:
        """Remove the lock file (still locked, so no sweep can be waiting on it) and drop the lock."""
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.folder / LOCK_NAME)
            os.close(self.fd)  # closing the last descriptor of the open file drops the flock
            self.fd = None

    def __enter__(self) -> "OutputLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def claim_output(folder: Path) -> OutputLock:
    """Check ``folder`` for a sweep and lock it for this process, before anything is written there.

    The folder may be missing (it is created), empty, or hold only a sweep's own files
    (:data:`SWEEP_FILES`, each checked to be one); the sweep appends to them and deletes nothing.
    ``fcntl.flock`` on ``folder/.sweep.lock`` (holding this pid), held until :meth:`OutputLock.release`
    (which removes the file) or the process ends however it ends (the kernel drops the lock; the file
    stays, and the next sweep takes it over), keeps a second sweep out.

    Raises:
        OutputFolderError: the folder is a file, holds something a sweep does not write (named), cannot
            be created or locked, or another sweep holds it (its pid named).
    """
    import fcntl

    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise OutputFolderError(f"--output {folder} is a file, not a folder")
    if folder.is_dir():
        try:
            foreign = foreign_entry(folder)
        except OSError as error:
            raise OutputFolderError(f"--output {folder}: cannot read it ({error.strerror or error})") from None
        if foreign is not None:
            raise OutputFolderError(
                f"--output {folder} holds {foreign}, which a sweep does not write; a sweep writes only into a missing "
                f"or empty folder or one holding a sweep's own files ({', '.join(SWEEP_FILES[:-1])}); nothing was changed"
            )
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OutputFolderError(f"--output {folder}: cannot create it ({error.strerror or error})") from None
    path = folder / LOCK_NAME
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as error:
            raise OutputFolderError(f"--output {folder}: cannot write there ({error.strerror or error})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            holder = ""
            with contextlib.suppress(OSError, ValueError):
                holder = os.pread(fd, 32, 0).decode().strip()
            os.close(fd)
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                who = f"another sweep (pid {holder})" if holder.isdigit() else "another sweep"
                raise OutputFolderError(f"--output {folder} is in use by {who}; wait for it to end or choose another --output") from None
            raise OutputFolderError(f"--output {folder}: cannot lock {LOCK_NAME} ({error.strerror or error})") from None
        try:  # the sweep before may have removed the file between our open and our lock: lock the one there now
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except OSError:
            same = False
        if same:
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return OutputLock(folder, fd)


# ── Identity of a run: versions and code revision ───────────────────────────


def versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for package in ("torch", "transformers", "onnx", "onnxscript", "onnx-ir", "onnxruntime", "executorch"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return out


def code_revision() -> str:
    """``<git HEAD>+<hash of the package sources>``: a job's record is reused only under the same code."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        head = ""
    return f"{head or 'nogit'}+{digest.hexdigest()[:12]}"


def shapes_label(spec: dict[str, Any]) -> str:
    """``static``, ``dynamic`` or ``generation`` (a generation-mode job) for a spec or a record."""
    if spec.get("mode") == "generation":
        return "generation"
    return "dynamic" if spec["dynamic"] else "static"


def cache_label(spec: dict[str, Any]) -> str:
    """The cache kind of a spec or a record (:data:`~.job.CACHE_KINDS`): a forward job's ``cache``, ``off`` when it
    has none (records written before cache kinds existed built every model with ``use_cache=False``); a generation
    job is ``default`` (its model keeps the config's ``use_cache``)."""
    if spec.get("mode") == "generation":
        return "default"
    return spec.get("cache") or "off"


def job_key(spec: dict[str, Any]) -> str:
    """``engine|backend|shapes|class``, with ``|cache=default`` appended for a forward job of the ``default``
    cache kind and ``|cpp`` for an ExecuTorch job on the C++ runner. A key without ``|cache=`` is the ``off``
    kind: the keys of records written before cache kinds existed keep their meaning."""
    cpp = "|cpp" if spec.get("runtime") == "cpp" and spec["backend"] == "executorch" else ""
    cache = "|cache=default" if spec.get("mode") != "generation" and spec.get("cache") == "default" else ""
    return f"{spec.get('engine', 'ours')}|{spec['backend']}|{shapes_label(spec)}|{spec['class']}{cache}{cpp}"


# ── Results file ─────────────────────────────────────────────────────────────


class ResultStore:
    """``results.jsonl``: one record per line, appended and flushed as each job ends."""

    def __init__(self, path: Path, versions: dict[str, str], revision: str):
        self.path = Path(path)
        self.versions = versions
        self.revision = revision
        self._lock = threading.Lock()

    def records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a kill: ignored
                continue
        return out

    def done(self, any_revision: bool = False, retry: Iterable[str] = ()) -> set[str]:
        """Keys of jobs recorded under the current versions and revision (any revision with ``any_revision``).

        ``retry``: stages (``tiny config``, ``exporter trace ...``) or outcomes (``timeout``, ``crash``,
        ``oom``) whose jobs count as not done when their latest record ended there, so a rerun repeats them.
        """
        retry = set(retry)
        latest: dict[str, dict[str, Any]] = {}
        for r in self.records():
            if r.get("versions") == self.versions and (any_revision or r.get("revision") == self.revision):
                latest[r["key"]] = r
        return {
            key for key, r in latest.items()
            if not (r.get("outcome") != "pass" and (r.get("stage") in retry or r.get("outcome") in retry))
        }

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, sort_keys=True) + "\n"
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as handle:
                handle.write(line)
                handle.flush()
                os.fsync(handle.fileno())


# ── Zygote (child side) ──────────────────────────────────────────────────────


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


def _group_rss_bytes(pgid: int) -> int:
    total = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pgid:
                    total += _rss_bytes(int(entry))
            except OSError:
                continue
    return total


#: the job a zygote is waiting on, as (pid, result file), for its SIGTERM / SIGINT handler
_current_job: tuple[int, str] | None = None


def _kill_group(pid: int) -> None:
    """SIGKILL the process group ``pid`` leads (a job's child and its helpers), or the process alone."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def run_forked(spec: dict[str, Any], timeout: float, memory_bytes: int) -> dict[str, Any]:
    """Fork a child that runs ``spec``; return its record, or a timeout / crash / oom record.

    ``oom`` and ``timeout`` are recorded only when this function killed the child for passing the
    memory cap or the time limit; a child killed by any other signal (``kill -9``, the kernel's
    out-of-memory killer) is a ``crash`` naming the signal. The child dies with the thread that forked
    it, and writes nothing once its parent is gone.
    """
    global _current_job
    from .job import classify, run_job

    handle, result_path = tempfile.mkstemp(prefix="hf-sweep-result-", suffix=".json")
    os.close(handle)
    started = time.monotonic()
    parent = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the zygote's handlers
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            _die_with_parent(signal.SIGKILL)
            if os.getppid() != parent:  # the parent died before the line above
                os._exit(0)
            os.setpgid(0, 0)
            try:
                result = run_job(spec)
            except BaseException as error:  # noqa: BLE001
                result = {"outcome": "crash", "stage": "job", "message": f"{type(error).__name__}: {error}"[:300]}
            if os.getppid() != parent:  # orphaned: nobody reads the result, write nothing
                with contextlib.suppress(OSError):
                    os.unlink(result_path)
                os._exit(0)
            with open(result_path, "w") as out:
                json.dump(result, out)
        except BaseException:  # noqa: BLE001
            code = 3
        finally:
            os._exit(code)
    _current_job = (pid, result_path)
    killed_for: str | None = None  # "timeout" or "oom": set only when this loop kills the child
    status = 0
    peak = 0
    last_memory_check = 0.0
    while True:
        done_pid, status = os.waitpid(pid, os.WNOHANG)
        if done_pid == pid:
            break
        elapsed = time.monotonic() - started
        if elapsed > timeout:
            killed_for = "timeout"
        elif elapsed - last_memory_check >= 0.5:
            last_memory_check = elapsed
            rss = _group_rss_bytes(pid)
            peak = max(peak, rss)
            if rss > memory_bytes:
                killed_for = "oom"
        if killed_for:
            _kill_group(pid)
            os.waitpid(pid, 0)
            break
        time.sleep(0.1)
    _current_job = None
    seconds = round(time.monotonic() - started, 2)
    with contextlib.suppress(OSError):  # the child's group may be gone already
        os.killpg(pid, signal.SIGKILL)  # leftovers of the child's group (a runtime's helper processes)
    record: dict[str, Any] | None = None
    if killed_for is None and os.path.getsize(result_path) > 0:
        try:
            with open(result_path) as handle:
                record = json.load(handle)
        except (OSError, json.JSONDecodeError):
            record = None
    os.unlink(result_path)
    if record is None:
        if killed_for == "timeout":
            outcome, message = "timeout", f"timeout: no result after {timeout:g} s"
        elif killed_for == "oom":
            outcome, message = "oom", f"out of memory: resident memory passed {memory_bytes / 2**30:.1f} GiB"
        elif os.WIFSIGNALED(status):  # killed, but not by us: the kernel's OOM killer or anyone's kill
            outcome, message = "crash", f"killed by signal {signal_label(os.WTERMSIG(status))}"
        else:
            outcome, message = "crash", f"exit code {os.WEXITSTATUS(status)} without a result"
        record = {"outcome": outcome, "stage": outcome, "kind": classify(message, outcome), "blamed": None, "message": message}
        record["seconds"] = seconds
    record["peak_rss_mb"] = round(peak / 2**20)
    return record


def _zygote_stop(signum: int, frame: Any) -> None:
    """A zygote's SIGTERM / SIGINT (also what it gets when its sweep dies): kill the job, write nothing, exit."""
    job = _current_job
    if job is not None:
        _kill_group(job[0])
        with contextlib.suppress(OSError):
            os.unlink(job[1])
    os._exit(128 + signum)


def zygote_main() -> None:
    """Read one job per stdin line (JSON: spec, timeout, memory), answer one JSON record per line."""
    expected_parent = int(os.environ.get(PARENT_ENV) or os.getppid())
    signal.signal(signal.SIGTERM, _zygote_stop)
    signal.signal(signal.SIGINT, _zygote_stop)
    _die_with_parent(signal.SIGTERM)
    if os.getppid() != expected_parent:  # the sweep died before the line above
        os._exit(0)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import importlib
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    extra = tuple(m for m in os.environ.get(PRELOAD_ENV, "").split(",") if m)
    for module in _HEAVY_MODULES + extra:
        # a missing optional backend fails in its jobs, with its message
        with contextlib.suppress(Exception):
            importlib.import_module(module)
    out = sys.stdout
    sys.stdout = sys.stderr  # everything a model prints goes to stderr; stdout carries records only
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        record = run_forked(request["spec"], float(request["timeout"]), int(request["memory"]))
        if os.getppid() != expected_parent:  # the sweep is gone: nobody to answer
            os._exit(0)
        out.write(json.dumps(record) + "\n")
        out.flush()


# ── Zygote (sweep side) ──────────────────────────────────────────────────────


class Zygote:
    """A zygote process and the pipe to it; restarted when it dies."""

    def __init__(self, log: Path | None = None, preload: tuple[str, ...] = ()):
        self.log = log
        self.preload = preload
        self.process: subprocess.Popen[str] | None = None
        #: the signal that stopped the zygote during the last job (SIGINT, SIGTERM, ...), else None
        self.stopped_by: int | None = None

    def _start(self) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", PYTHONWARNINGS="ignore")
        env[PRELOAD_ENV] = ",".join(self.preload)
        env[PARENT_ENV] = str(os.getpid())
        stderr: Any = open(self.log, "a") if self.log else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, "-m", "hf_exporters.sweep.runner"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
        )
        ready = self.process.stdout.readline()  # type: ignore[union-attr]
        if not ready:
            raise RuntimeError("the sweep zygote exited while importing torch/transformers")

    def run(self, spec: dict[str, Any], timeout: float, memory_bytes: int) -> dict[str, Any]:
        self.stopped_by = None
        if self.process is None or self.process.poll() is not None:
            self._start()
        assert self.process is not None and self.process.stdin and self.process.stdout
        try:
            self.process.stdin.write(json.dumps({"spec": spec, "timeout": timeout, "memory": memory_bytes}) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            code = self.process.poll() if self.process is not None else None
            if code is None and self.process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    code = self.process.wait(timeout=2)
            self.close()
            self.stopped_by = None
            if code is not None and code < 0:  # killed by a signal's default action
                self.stopped_by = -code
            elif code in (128 + signal.SIGINT, 128 + signal.SIGTERM):  # its own handler: job killed, then exit
                self.stopped_by = code - 128
            how = f"was stopped by signal {signal_label(self.stopped_by)}" if self.stopped_by else "died"
            return {"outcome": "crash", "stage": "crash", "kind": "crash", "blamed": None, "message": f"the job's zygote process {how}"}
        return json.loads(line)

    def kill(self) -> None:
        """Stop the zygote now: SIGTERM (it kills its job's process group and writes nothing), then SIGKILL."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(OSError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=3)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                process.kill()

    def close(self) -> None:
        if self.process is not None:
            try:
                self.process.stdin.close()  # type: ignore[union-attr]
                self.process.wait(timeout=5)
            except Exception:  # noqa: BLE001
                self.process.kill()
            self.process = None


def preload_for(specs: Iterable[dict[str, Any]]) -> tuple[str, ...]:
    """The extra modules a zygote imports for ``specs``: ExecuTorch's when any job exports to it."""
    return _EXECUTORCH_MODULES if any(s.get("backend") == "executorch" for s in specs) else ()


def run_isolated(spec: dict[str, Any], timeout: float = DEFAULT_TIMEOUT, memory_gb: float = DEFAULT_MEMORY_GB) -> dict[str, Any]:
    """One job in a fresh zygote (what each Ray task runs)."""
    zygote = Zygote(preload=preload_for([spec]))
    try:
        return zygote.run(spec, timeout, int(memory_gb * 2**30))
    finally:
        zygote.close()


# ── The pool ─────────────────────────────────────────────────────────────────

#: stages that do not depend on the backend or the engine: one failure there stands for the class
CLASS_STAGES = ("tiny config", "inputs", "eager", "signal")


class SweepInterrupted(BaseException):
    """SIGTERM or SIGINT reached the sweep: its running jobs were killed and not recorded."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


def run_jobs(
    specs: list[dict[str, Any]],
    store: ResultStore,
    *,
    jobs: int = 1,
    timeout: float = DEFAULT_TIMEOUT,
    memory_gb: float = DEFAULT_MEMORY_GB,
    ray_address: str | None = None,
    progress: bool = True,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    log: Path | None = None,
) -> list[dict[str, Any]]:
    """Run ``specs`` (already filtered for resume), append each record to ``store``, return the records.

    Called from the main thread, SIGTERM and SIGINT stop the run: the zygotes and their jobs are killed,
    nothing more is recorded, and :class:`SweepInterrupted` is raised (the records already appended stay).
    """
    from .job import classify

    memory = int(memory_gb * 2**30)
    records: list[dict[str, Any]] = []
    class_failures: dict[tuple[str, str, str], dict[str, Any]] = {}  # (class, mode, cache) -> its first class-level failure
    counts = {"pass": 0, "fail": 0, "skip": 0, "timeout": 0, "crash": 0, "oom": 0}
    bar = _progress(len(specs), progress)
    lock = threading.Lock()
    stopping = threading.Event()
    zygotes: list[Zygote] = []

    def finish(spec: dict[str, Any], result: dict[str, Any]) -> None:
        if stopping.is_set():  # a job killed by the stop, not by itself: not recorded
            return
        record = dict(result)
        record.update(
            key=job_key(spec),
            engine=spec.get("engine", "ours"),
            backend=spec["backend"],
            dynamic=bool(spec["dynamic"]),
            mode=spec.get("mode", "forward"),
            cache=cache_label(spec),
            runtime=spec.get("runtime", "python") if spec["backend"] == "executorch" else "python",
            model_class=spec["class"],
            model_type=spec.get("model_type"),
            versions=store.versions,
            revision=store.revision,
            finished=time.strftime("%Y-%m-%dT%H:%M:%S"),
        )
        if record.get("outcome") != "pass" and record.get("message") and not record.get("kind"):
            record["kind"] = classify(record["message"], record.get("outcome", "fail"))
        store.append(record)
        with lock:
            records.append(record)
            if record.get("outcome") == "fail" and record.get("stage") in CLASS_STAGES:
                class_failures.setdefault((spec["class"], spec.get("mode", "forward"), cache_label(spec)), record)
            counts[record.get("outcome", "fail")] = counts.get(record.get("outcome", "fail"), 0) + 1
            if bar is not None:
                bar.set_postfix_str(" ".join(f"{k}={v}" for k, v in counts.items() if v), refresh=False)
                bar.update(1)
        if on_record:
            on_record(record)

    def reused(spec: dict[str, Any]) -> dict[str, Any] | None:
        with lock:
            earlier = class_failures.get((spec["class"], spec.get("mode", "forward"), cache_label(spec)))
        if earlier is None:
            return None
        copy = {k: earlier[k] for k in ("outcome", "stage", "kind", "blamed", "message", "signal") if k in earlier}
        copy.update(seconds=0.0, reused_from=earlier["key"])
        return copy

    pending: queue.Queue[dict[str, Any] | None] = queue.Queue()
    for spec in specs:
        if spec.get("skip"):
            finish(spec, {"outcome": "skip", "stage": None, "kind": "skip", "blamed": None, "message": spec["skip"], "seconds": 0.0})
        else:
            pending.put(spec)

    def stop(signum: int, frame: Any) -> None:
        stopping.set()
        for zygote in list(zygotes):  # no lock: the main thread may hold it (finish on the Ray path)
            zygote.kill()
        raise SweepInterrupted(signum)

    handlers: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            handlers[signum] = signal.signal(signum, stop)
    try:
        if ray_address:
            _run_on_ray(pending, finish, reused, ray_address, timeout, memory_gb)
        else:
            preload = preload_for(specs)

            def worker() -> None:
                zygote = Zygote(log, preload)
                with lock:
                    zygotes.append(zygote)
                try:
                    while not stopping.is_set():
                        try:
                            spec = pending.get_nowait()
                        except queue.Empty:
                            return
                        try:
                            result = reused(spec) or zygote.run(spec, timeout, memory)
                        except Exception as error:  # noqa: BLE001 - the zygote could not start
                            zygote.close()
                            result = {"outcome": "crash", "stage": "crash", "kind": "crash", "blamed": None,
                                      "message": f"sweep worker: {type(error).__name__}: {str(error)[:200]}"}
                        if zygote.stopped_by in (signal.SIGINT, signal.SIGTERM) and stopping.wait(2.0):
                            return  # Ctrl-C reached the zygote too, before the sweep's own handler ran
                        finish(spec, result)
                finally:
                    if stopping.is_set():
                        zygote.kill()
                    zygote.close()

            threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, jobs))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        if bar is not None:
            bar.close()
    return records


def _run_on_ray(pending: "queue.Queue[Any]", finish: Callable, reused: Callable, address: str, timeout: float, memory_gb: float) -> None:
    from ..deps import require

    ray = require("ray", "--ray")
    if not ray.is_initialized():
        ray.init(address=None if address in ("local", "auto-local") else address, ignore_reinit_error=True, log_to_driver=False)
    remote = ray.remote(num_cpus=1)(run_isolated)
    in_flight: dict[Any, dict[str, Any]] = {}
    specs = []
    while True:
        try:
            specs.append(pending.get_nowait())
        except queue.Empty:
            break
    for spec in specs:
        result = reused(spec)
        if result is not None:
            finish(spec, result)
            continue
        in_flight[remote.remote(spec, timeout, memory_gb)] = spec
    while in_flight:
        ready, _ = ray.wait(list(in_flight), num_returns=1)
        for ref in ready:
            spec = in_flight.pop(ref)
            try:
                result = ray.get(ref)
            except Exception as error:  # noqa: BLE001 - a lost Ray worker
                result = {"outcome": "crash", "stage": "crash", "kind": "crash", "blamed": None, "message": f"ray: {type(error).__name__}: {str(error)[:200]}"}
            finish(spec, result)


def _progress(total: int, enabled: bool) -> Any:
    if not enabled or total == 0:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="job", dynamic_ncols=True, smoothing=0.05)


def plan(
    classes: Iterable[tuple[str, str]],
    backends: list[str],
    engines: list[str],
    dynamics: list[bool],
    skip_reason: Callable[[str, str, bool], str | None] | None = None,
    recheck_skips: bool = False,
    cache_kinds: Callable[[str], list[str]] | None = None,
) -> list[dict[str, Any]]:
    """Job specs in priority order: each dynamic setting in turn (static first), then class by class,
    each cache kind of the class (default first), every backend, ours then upstream, so a partial run
    compares both kinds and both engines on the same classes.
    A ``dynamics`` entry ``"generation"`` plans generation-mode jobs (dynamic, ours only, no cache kind).

    ``cache_kinds``: the cache kinds (:data:`~.job.CACHE_KINDS`) of a class's forward jobs
    (:func:`cache_kinds_for`); without it, one job per class with no ``cache`` in its spec (the ``off`` kind)."""
    classes = list(classes)
    specs = []
    for dynamic in dynamics:
        generation = dynamic == "generation"
        for class_name, model_type in classes:
            kinds: list[str | None] = [None] if generation or cache_kinds is None else list(cache_kinds(class_name))
            for cache in kinds:
                for backend in backends:
                    for engine in engines:
                        if generation and engine != "ours":
                            continue
                        spec = {"class": class_name, "model_type": model_type, "backend": backend, "dynamic": bool(dynamic), "engine": engine}
                        if generation:
                            spec["mode"] = "generation"
                        if cache is not None:
                            spec["cache"] = cache
                        reason = skip_reason(class_name, backend, bool(dynamic)) if skip_reason else None
                        if reason:
                            if recheck_skips:
                                spec["recheck"] = reason
                            else:
                                spec["skip"] = reason
                        specs.append(spec)
    return specs


def cache_kinds_for(
    asked: list[str], has_use_cache: Callable[[str], bool], default_only: Iterable[str] | None = None
) -> Callable[[str], list[str]]:
    """The ``cache_kinds`` of :func:`plan`: of the kinds ``asked`` (in :data:`~.job.CACHE_KINDS` order), ``default``
    for every class and ``off`` for a class whose config has a ``use_cache`` field (``has_use_cache``): a class
    without one has a single job, of kind ``default``. ``default_only``: when given, the classes with the field
    whose ``default`` kind is planned (the smoke set's); the others with the field run ``off`` only."""
    from .job import CACHE_KINDS

    wanted = [k for k in CACHE_KINDS if k in asked]
    chosen = None if default_only is None else set(default_only)

    def kinds(class_name: str) -> list[str]:
        field = has_use_cache(class_name)
        out = []
        for kind in wanted:
            if kind == "off" and field:
                out.append(kind)
            elif kind == "default" and (not field or chosen is None or class_name in chosen):
                out.append(kind)
        return out

    return kinds


if __name__ == "__main__":
    zygote_main()
