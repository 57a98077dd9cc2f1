"""The artifact folder's rules (hf_exporters.folders) and interrupts (hf_exporters.interrupts):
what --overwrite may replace, what a failure, an interrupt or a killed process leaves behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from hf_exporters import interrupts
from hf_exporters.errors import InputError
from hf_exporters.folders import STAGING_MARKER, check_output_folder, remove_stale_staging, staged_folder


def _earlier_export(folder, files=("model.pt2", "config.json")):
    folder.mkdir(parents=True, exist_ok=True)
    for name in files:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("artifact")
    (folder / "export.json").write_text(json.dumps({"files": [*files, "export.json"]}))


def test_overwrite_refuses_a_stray_manifest_beside_user_files(tmp_path):
    """The reported case: a stray export.json beside thesis.tex and src/main.py; nothing may be deleted."""
    project = tmp_path / "myproject"
    (project / "src").mkdir(parents=True)
    (project / "export.json").write_text("{}")
    (project / "thesis.tex").write_text("years of work")
    (project / "src" / "main.py").write_text("print()")
    with pytest.raises(InputError) as caught:
        check_output_folder(project, overwrite=True)
    assert str(caught.value) == (
        f"--overwrite replaces earlier exports only: {project / 'export.json'} does not list the files an export "
        f"wrote, so {project} is left alone (remove it yourself if it is yours)"
    )
    # the same stray manifest listing files: the first file it does not list is named
    (project / "export.json").write_text(json.dumps({"files": ["export.json", "model.pt2"]}))
    with pytest.raises(InputError) as caught:
        check_output_folder(project, overwrite=True)
    assert str(caught.value) == (
        f"--overwrite replaces earlier exports only: {project} holds thesis.tex, which the export there did not write, "
        "so nothing is deleted"
    )
    assert (project / "thesis.tex").read_text() == "years of work" and (project / "src" / "main.py").is_file()


@pytest.mark.parametrize(
    ("extra", "named"),
    [("notes.txt", "notes.txt"), ("decode/notes.txt", "decode/notes.txt"), ("empty_dir/", "empty_dir/")],
)
def test_overwrite_names_the_first_file_an_export_did_not_write(tmp_path, extra, named):
    out = tmp_path / "out"
    _earlier_export(out, files=("config.json", "decode/model.pte", "prefill/model.pte"))
    check_output_folder(out, overwrite=True)  # exactly what the export wrote: replaceable
    target = out / extra
    if extra.endswith("/"):
        target.mkdir()
    else:
        target.write_text("mine")
    with pytest.raises(InputError, match=f"holds {named}, which the export there did not write"):
        check_output_folder(out, overwrite=True)


def test_staged_folder_lists_every_file_and_replaces_only_a_clean_export(tmp_path):
    out = tmp_path / "out"
    manifest: dict = {}
    with staged_folder(out, manifest) as staging:
        (staging / "model.pte").write_text("x")
        (staging / "decode").mkdir()
        (staging / "decode" / "model.pte").write_text("y")
    written = json.loads((out / "export.json").read_text())
    assert written["files"] == ["decode/model.pte", "model.pte", "export.json"]
    assert sorted(p.name for p in out.iterdir()) == ["decode", "export.json", "model.pte"]  # no marker left
    # a file added after the check is still not deleted: the replacement checks again
    manifest = {}
    with pytest.raises(InputError, match="holds late.txt"):
        with staged_folder(out, manifest) as staging:
            (out / "late.txt").write_text("mine")
            (staging / "model.pte").write_text("z")
    assert (out / "late.txt").read_text() == "mine" and (out / "model.pte").read_text() == "x"
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name or ".old-" in p.name] == []


def test_failure_removes_staging_and_the_parents_it_created(tmp_path):
    out = tmp_path / "a" / "b" / "out"
    with pytest.raises(RuntimeError, match="boom"):
        with staged_folder(out, {}) as staging:
            (staging / "model.pte").write_text("x")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("afile/sub", "cannot create the output folder {out}: {tmp}/afile is a file, not a folder"),
        ("ro/out", "cannot create the output folder {out}: {tmp}/ro is not writable"),
    ],
)
def test_unwritable_output_is_one_input_error(tmp_path, target, message):
    (tmp_path / "afile").write_text("keep")
    (tmp_path / "ro").mkdir(mode=0o555)
    out = tmp_path / target
    if target.startswith("ro") and os.access(tmp_path / "ro", os.W_OK):
        pytest.skip("running as a user that can write a read-only folder (root)")
    with pytest.raises(InputError) as caught:
        check_output_folder(out, overwrite=False)
    assert str(caught.value) == message.format(out=out, tmp=tmp_path)


def test_unwritable_place_fails_when_staging(tmp_path):
    """/proc and /sys refuse new folders even to root: the staging step says so in one line."""
    with pytest.raises(InputError, match=r"^cannot write the output folder /proc/hfx-test/out: "):
        with staged_folder(__import__("pathlib").Path("/proc/hfx-test/out"), {}):
            pass


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_staging_of_a_dead_process_is_removed(tmp_path):
    dead = _dead_pid()
    stale = tmp_path / f".out.tmp-{dead}-abcd1234"
    stale.mkdir()
    (stale / STAGING_MARKER).write_text(f"{dead}\n")
    (stale / "model.pte").write_bytes(b"\0" * 1024)
    alive = tmp_path / f".out.tmp-{os.getpid()}-abcd1234"  # this process: still running
    alive.mkdir()
    (alive / STAGING_MARKER).write_text(f"{os.getpid()}\n")
    unmarked = tmp_path / f".notes.tmp-{dead}-abcd1234"  # not ours: no marker
    unmarked.mkdir()
    assert remove_stale_staging(tmp_path) == [stale]
    assert not stale.exists() and alive.exists() and unmarked.exists()
    # the next export into the same parent folder removes stale staging folders on its own
    alive.rename(tmp_path / f".out.tmp-{dead}-00000000")
    (tmp_path / f".out.tmp-{dead}-00000000" / STAGING_MARKER).write_text(f"{dead}\n")
    with staged_folder(tmp_path / "other", {}) as staging:
        (staging / "x").write_text("x")
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".notes.tmp-{dead}-abcd1234", "other"]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallowed interrupt, on purpose
def test_an_interrupt_swallowed_by_a_finalizer_still_stops_the_export(tmp_path):
    """Ctrl-C that lands in a __del__ is printed as "Exception ignored" and lost; the recorded signal
    stops the export before the folder is moved into place."""

    class Finalized:
        def __del__(self):
            signal.raise_signal(signal.SIGINT)  # the handler's KeyboardInterrupt is raised here and ignored

    out = tmp_path / "out"
    with interrupts.handled():
        with pytest.raises(interrupts.Interrupted) as caught:
            with staged_folder(out, {}) as staging:
                (staging / "model.pte").write_text("x")
                Finalized()  # deleted at once: the interrupt is swallowed
                (staging / "more").write_text("the export went on")
    assert caught.value.exit_code == 130 and str(caught.value) == "interrupted by SIGINT"
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored after the block
