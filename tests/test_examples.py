"""The bundled images are found by name from any folder; a wrong name lists the right ones."""
import pytest
from conftest import ROOT

from arr_coc import examples
from arr_coc.registry import UnknownNameError


def test_every_bundled_image_is_found_by_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative "examples/receipt.jpg" would not resolve here
    assert examples.names() == ["form.jpg", "photo.jpg", "receipt.jpg"]
    for name in examples.names():
        found = examples.path(name)
        assert found.is_absolute() and found.read_bytes() == (ROOT / "examples" / name).read_bytes()


def test_a_wrong_name_lists_the_bundled_ones():
    with pytest.raises(UnknownNameError) as err:
        examples.path("recipt.jpg")
    assert str(err.value) == "no bundled example 'recipt.jpg'; bundled: form.jpg, photo.jpg, receipt.jpg"
    with pytest.raises(UnknownNameError):
        examples.path("__init__.py")  # the package's own code is no example
