"""zoo.files, the one home of atomic writes: a failed write leaves the earlier file or folder as it was."""

import json

import pytest

from zoo.files import atomic_path, write_json


def test_write_json_replaces_only_a_whole_file(tmp_path):
    path = tmp_path / "run.json"
    write_json(path, {"step": 1})
    before = path.read_bytes()
    with pytest.raises(TypeError):
        write_json(path, {"step": 2, "oops": object()})  # json.dump fails half-way through the file
    assert path.read_bytes() == before and json.loads(before) == {"step": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]  # no temporary left behind
    write_json(path, {"step": 2})
    assert json.loads(path.read_text()) == {"step": 2}


def test_a_failed_folder_write_keeps_the_earlier_folder(tmp_path):
    folder = tmp_path / "export"
    with atomic_path(folder) as tmp:
        tmp.mkdir()
        (tmp / "a").write_text("first")
    with pytest.raises(RuntimeError), atomic_path(folder, overwrite=True) as tmp:
        tmp.mkdir()
        (tmp / "a").write_text("second")
        raise RuntimeError("killed half-way")
    assert (folder / "a").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]
    with pytest.raises(FileExistsError, match="overwrite=True"):
        with atomic_path(folder):
            pass
