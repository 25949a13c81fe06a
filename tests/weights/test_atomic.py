"""Nothing lost: every write is whole or absent, a full disk is one line naming the path and the free space."""
import errno
import re

import pytest
import torch
from PIL import Image

from arr_coc.cli import main
from arr_coc.errors import DiskFullError
from arr_coc.weights import files
from arr_coc.weights.files import atomic_save, atomic_write


class FullDisk:
    """A real temporary file that takes ``room`` bytes, then fails as a full disk does."""

    def __init__(self, path, room=64, code=errno.ENOSPC):
        self.f, self.room, self.code = open(path, "wb"), room, code

    def write(self, data):
        if len(data) > self.room:
            self.f.write(bytes(data[:self.room]))
            self.room = 0
            raise OSError(self.code, "No space left on device")
        self.room -= len(data)
        return self.f.write(data)

    def flush(self):
        self.f.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


FULL = re.compile(r"(?P<path>\S+): no space left on device while writing it \([0-9.]+ [KMGT]?i?B free there\); "
                  r"nothing was written: free some space or write elsewhere")


def test_a_full_disk_is_one_line_and_leaves_the_earlier_file_and_no_temporary(tmp_path):
    target = tmp_path / "w.pt"
    atomic_save({"format": "demo/1", "x": torch.ones(3)}, target)
    before = target.read_bytes()
    with pytest.raises(DiskFullError) as caught:
        atomic_write(target, lambda f: torch.save({"x": torch.zeros(10_000)}, f), opener=FullDisk)
    message = str(caught.value)
    assert "\n" not in message and FULL.fullmatch(message) and FULL.fullmatch(message)["path"] == str(target)
    assert isinstance(caught.value, OSError)  # the CLI's one-line class of errors
    assert [p.name for p in tmp_path.iterdir()] == ["w.pt"] and target.read_bytes() == before


def test_any_other_failure_keeps_its_own_error_and_still_removes_the_temporary(tmp_path):
    def boom(f):
        f.write(b"half")
        raise KeyError("a bug keeps its traceback")

    with pytest.raises(KeyError):
        atomic_write(tmp_path / "a.json", boom)
    with pytest.raises(OSError, match=r"\[Errno 13\]") as caught:
        atomic_write(tmp_path / "b.json", lambda f: f.write(b"x"), opener=lambda p: FullDisk(p, 0, errno.EACCES))
    assert not isinstance(caught.value, DiskFullError)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def full_disk(monkeypatch):
    """Every atomic write whose name contains one of ``names`` meets a full disk."""
    names = []

    def opener(path):
        return FullDisk(path) if any(n in path.name for n in names) else open(path, "wb")

    monkeypatch.setattr(files, "open_temp", opener)
    return names


def test_look_never_leaves_a_zero_byte_png(tmp_path, full_disk, capsys):
    image = tmp_path / "page.png"
    Image.new("RGB", (112, 84), "white").save(image)
    out = tmp_path / "out" / "page_arr.png"
    full_disk.append("page_arr.png")
    code = main(["look", str(image), "Where?", "--channels", "mvp", "--query-encoder", "hashing", "--saccades", "4",
                 "--scorer-weights", "none", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and FULL.fullmatch(err.removeprefix("arr-coc: error: "))
    assert list(out.parent.iterdir()) == []  # no 0-byte PNG, no temporary
    full_disk.clear()
    assert main(["look", str(image), "Where?", "--channels", "mvp", "--query-encoder", "hashing", "--saccades", "4",
                 "--scorer-weights", "none", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
