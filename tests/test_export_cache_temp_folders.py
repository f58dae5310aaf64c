"""The export cache's temporary folders: one left by an exporter killed mid-write (``kill -9``) is
removed at the next start, one of an exporter still writing (another process) is kept; a failed
rename into place other than "another process stored it first" is logged."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

ov = pytest.importorskip("openvino")

from adapters.runtimes.cpu import export
from adapters.runtimes.cpu.export import ModelCache

KEY = "0" * 32

# An exporter that writes its entry, then stops before the rename, as if still writing.
_EXPORTER = """
import sys, time
from pathlib import Path
import openvino as ov
import openvino.opset13 as ops
from adapters.runtimes.cpu.export import ModelCache

save = ov.save_model
def save_and_hang(*args, **kwargs):
    save(*args, **kwargs)
    print("saved", flush=True)
    time.sleep(600)
ov.save_model = save_and_hang
p = ops.parameter([1], ov.Type.f32)
ModelCache(Path(sys.argv[1])).store(sys.argv[2], ov.Model([ops.relu(p)], [p]), {})
"""


def _model() -> object:
    import openvino.opset13 as ops

    p = ops.parameter([1], ov.Type.f32)
    return ov.Model([ops.relu(p)], [p])


def _start(root: Path) -> None:
    """What a model's start does with the cache (another key than the temporary folders')."""
    ModelCache(root).get_or_build("1" * 32, ov.Core(), _model, {})


def _age(folder: Path, seconds: float) -> None:
    then = time.time() - seconds
    for p in [folder, *folder.iterdir()]:
        os.utime(p, (then, then))


def _temps(root: Path) -> list[Path]:
    return sorted(root.glob(f".{KEY}-*"))


def test_folder_of_a_killed_exporter_is_removed_a_live_ones_kept(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), *sys.path])}
    child = subprocess.Popen([sys.executable, "-c", _EXPORTER, str(root), KEY], stdout=subprocess.PIPE, env=env)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"saved\n"
        (temp,) = _temps(root)
        _age(temp, 3 * 3600)  # however old: its exporter is alive
        _start(root)
        assert temp.is_dir() and (temp / "model.bin").is_file()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    _age(temp, 3 * 3600)
    _start(root)
    assert _temps(root) == []
    assert (root / ("1" * 32) / "manifest.json").is_file()
    assert not (root / ("1" * 32) / ".owner").exists()


def test_old_folder_without_an_owner_is_removed_a_fresh_one_kept(tmp_path: Path) -> None:
    """Folders of versions that recorded no owner: removed once old enough to be no export's."""
    root = tmp_path / "cache"
    old, fresh = root / f".{KEY}-old", root / f".{KEY}-new"
    for folder in (old, fresh):
        folder.mkdir(parents=True)
        (folder / "model.bin").write_bytes(b"\0" * 8)
    _age(old, 3 * 3600)
    _start(root)
    assert _temps(root) == [fresh]


def test_a_failed_rename_is_logged_and_the_model_still_served(tmp_path: Path, monkeypatch) -> None:
    def refuse(src: object, dst: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(dst))

    monkeypatch.setattr(export.os, "replace", refuse)
    with capture_logs() as logs:
        model, hit = ModelCache(tmp_path).get_or_build(KEY, ov.Core(), _model, {})
    assert model is not None and not hit
    (line,) = [entry for entry in logs if entry["event"] == "openvino_cache_store_failed"]
    assert line["log_level"] == "warning" and "Permission denied" in line["error"]
    assert list(tmp_path.iterdir()) == []
