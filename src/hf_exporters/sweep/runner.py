"""Run sweep jobs, each in a process of its own, with a time limit and a memory cap.

A *zygote* (``python -m hf_exporters.sweep.runner``) imports torch, transformers and the exporters
once, then forks one child per job it reads on stdin. The child runs :func:`~.job.run_job` and writes
its record to a file; the zygote waits with the time limit, watches the child's resident memory, and
kills its process group on a timeout or past the memory cap. It answers one JSON line per job, so a
crash, a hang or an out-of-memory is recorded as such and never takes another job with it.

The sweep process keeps ``--jobs N`` zygotes (or sends jobs to Ray workers, each running a zygote for
one job), appends each record to ``results.jsonl`` as it arrives (one line, flushed), and on a rerun
skips the jobs already done under the same library versions and code revision.
"""

from __future__ import annotations

import contextlib
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


def job_key(spec: dict[str, Any]) -> str:
    """``engine|backend|shapes|class``, with ``|cpp`` appended for an ExecuTorch job on the C++ runner."""
    cpp = "|cpp" if spec.get("runtime") == "cpp" and spec["backend"] == "executorch" else ""
    return f"{spec.get('engine', 'ours')}|{spec['backend']}|{shapes_label(spec)}|{spec['class']}{cpp}"


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


def run_forked(spec: dict[str, Any], timeout: float, memory_bytes: int) -> dict[str, Any]:
    """Fork a child that runs ``spec``; return its record, or a timeout / crash / oom record."""
    from .job import classify, run_job

    handle, result_path = tempfile.mkstemp(prefix="hf-sweep-result-", suffix=".json")
    os.close(handle)
    started = time.monotonic()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            os.setpgid(0, 0)
            record = run_job(spec)
            with open(result_path, "w") as out:
                json.dump(record, out)
        except BaseException as error:  # noqa: BLE001
            try:
                with open(result_path, "w") as out:
                    json.dump({"outcome": "crash", "stage": "job", "message": f"{type(error).__name__}: {error}"[:300]}, out)
            except BaseException:  # noqa: BLE001
                code = 3
        finally:
            os._exit(code)
    outcome: str | None = None
    status = 0
    peak = 0
    last_memory_check = 0.0
    while True:
        done_pid, status = os.waitpid(pid, os.WNOHANG)
        if done_pid == pid:
            break
        elapsed = time.monotonic() - started
        if elapsed > timeout:
            outcome = "timeout"
        elif elapsed - last_memory_check >= 0.5:
            last_memory_check = elapsed
            rss = _group_rss_bytes(pid)
            peak = max(peak, rss)
            if rss > memory_bytes:
                outcome = "oom"
        if outcome:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            break
        time.sleep(0.1)
    seconds = round(time.monotonic() - started, 2)
    with contextlib.suppress(OSError):  # the child's group may be gone already
        os.killpg(pid, signal.SIGKILL)  # leftovers of the child's group (a runtime's helper processes)
    record: dict[str, Any] | None = None
    if outcome is None and os.path.getsize(result_path) > 0:
        try:
            with open(result_path) as handle:
                record = json.load(handle)
        except (OSError, json.JSONDecodeError):
            record = None
    os.unlink(result_path)
    if record is None:
        if outcome == "timeout":
            message = f"timeout: no result after {timeout:g} s"
        elif outcome == "oom":
            message = f"out of memory: resident memory passed {memory_bytes / 2**30:.1f} GiB"
        elif os.WIFSIGNALED(status):
            message = f"killed by signal {os.WTERMSIG(status)} ({signal.Signals(os.WTERMSIG(status)).name})"
            outcome = "oom" if os.WTERMSIG(status) == signal.SIGKILL else "crash"
        else:
            message = f"exit code {os.WEXITSTATUS(status)} without a result"
            outcome = "crash"
        record = {"outcome": outcome, "stage": outcome, "kind": classify(message, outcome), "blamed": None, "message": message}
        record["seconds"] = seconds
    record["peak_rss_mb"] = round(peak / 2**20)
    return record


def zygote_main() -> None:
    """Read one job per stdin line (JSON: spec, timeout, memory), answer one JSON record per line."""
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
        out.write(json.dumps(record) + "\n")
        out.flush()


# ── Zygote (sweep side) ──────────────────────────────────────────────────────


class Zygote:
    """A zygote process and the pipe to it; restarted when it dies."""

    def __init__(self, log: Path | None = None, preload: tuple[str, ...] = ()):
        self.log = log
        self.preload = preload
        self.process: subprocess.Popen[str] | None = None

    def _start(self) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", PYTHONWARNINGS="ignore")
        env[PRELOAD_ENV] = ",".join(self.preload)
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
            self.close()
            return {"outcome": "crash", "stage": "crash", "kind": "crash", "blamed": None, "message": "the job's zygote process died"}
        return json.loads(line)

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
CLASS_STAGES = ("tiny config", "inputs", "eager")


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
    """Run ``specs`` (already filtered for resume), append each record to ``store``, return the records."""
    from .job import classify

    memory = int(memory_gb * 2**30)
    records: list[dict[str, Any]] = []
    class_failures: dict[tuple[str, str], dict[str, Any]] = {}  # (class, mode) -> its first class-level failure
    counts = {"pass": 0, "fail": 0, "skip": 0, "timeout": 0, "crash": 0, "oom": 0}
    bar = _progress(len(specs), progress)
    lock = threading.Lock()

    def finish(spec: dict[str, Any], result: dict[str, Any]) -> None:
        record = dict(result)
        record.update(
            key=job_key(spec),
            engine=spec.get("engine", "ours"),
            backend=spec["backend"],
            dynamic=bool(spec["dynamic"]),
            mode=spec.get("mode", "forward"),
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
                class_failures.setdefault((spec["class"], spec.get("mode", "forward")), record)
            counts[record.get("outcome", "fail")] = counts.get(record.get("outcome", "fail"), 0) + 1
            if bar is not None:
                bar.set_postfix_str(" ".join(f"{k}={v}" for k, v in counts.items() if v), refresh=False)
                bar.update(1)
        if on_record:
            on_record(record)

    def reused(spec: dict[str, Any]) -> dict[str, Any] | None:
        with lock:
            earlier = class_failures.get((spec["class"], spec.get("mode", "forward")))
        if earlier is None:
            return None
        copy = {k: earlier[k] for k in ("outcome", "stage", "kind", "blamed", "message") if k in earlier}
        copy.update(seconds=0.0, reused_from=earlier["key"])
        return copy

    pending: queue.Queue[dict[str, Any] | None] = queue.Queue()
    for spec in specs:
        if spec.get("skip"):
            finish(spec, {"outcome": "skip", "stage": None, "kind": "skip", "blamed": None, "message": spec["skip"], "seconds": 0.0})
        else:
            pending.put(spec)

    if ray_address:
        _run_on_ray(pending, finish, reused, ray_address, timeout, memory_gb)
    else:

        preload = preload_for(specs)

        def worker() -> None:
            zygote = Zygote(log, preload)
            try:
                while True:
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
                    finish(spec, result)
            finally:
                zygote.close()

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, jobs))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
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
) -> list[dict[str, Any]]:
    """Job specs in priority order: each dynamic setting in turn (static first), then class by class,
    every backend, ours then upstream, so a partial run compares both engines on the same classes.
    A ``dynamics`` entry ``"generation"`` plans generation-mode jobs (dynamic, ours only)."""
    classes = list(classes)
    specs = []
    for dynamic in dynamics:
        generation = dynamic == "generation"
        for class_name, model_type in classes:
            for backend in backends:
                for engine in engines:
                    if generation and engine != "ours":
                        continue
                    spec = {"class": class_name, "model_type": model_type, "backend": backend, "dynamic": bool(dynamic), "engine": engine}
                    if generation:
                        spec["mode"] = "generation"
                    reason = skip_reason(class_name, backend, bool(dynamic)) if skip_reason else None
                    if reason:
                        if recheck_skips:
                            spec["recheck"] = reason
                        else:
                            spec["skip"] = reason
                    specs.append(spec)
    return specs


if __name__ == "__main__":
    zygote_main()
