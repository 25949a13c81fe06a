"""The wheel works anywhere: built with ``python -m build``, installed into a fresh venv, run from another folder.

The fresh venv gets the wheel and nothing of the checkout. Its third-party dependencies are the ones
``make setup`` installed from the same ``pyproject.toml`` (this interpreter's site-packages, seen through a
``.pth`` line, the way ``venv --system-site-packages`` shows a base interpreter's): installing them again
would mean minutes of downloads (and a CUDA torch unless the CPU wheel is pinned first), and ``pip check``
proves every requirement the wheel declares is met by them. A ``.pth`` line adds a folder to ``sys.path``
without running the ``.pth`` files inside it, so the checkout's editable install stays invisible: the
test asserts ``arr_coc`` is imported from the venv.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from arr_coc.app.browser import server

ROOT = Path(__file__).resolve().parents[1]
CHECK_REQUIREMENTS = """
from importlib.metadata import PackageNotFoundError, distribution, version
from packaging.requirements import Requirement
dist = distribution("arr-coc")
print(dist.locate_file(""))
for req in map(Requirement, dist.requires):
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    try:
        if not req.specifier.contains(version(req.name), prereleases=True):
            print(req, "is", version(req.name))
    except PackageNotFoundError:
        print(req, "is missing")
"""
VERSION = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M)[1]  # the project's


def run(*cmd: str | Path, cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{cmd} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    """(the venv's bin folder, a working folder outside the checkout, the environment to run in)."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"  # what the sdist holds: building there keeps build/ and *.egg-info out of the checkout
    shutil.copytree(ROOT / "arr_coc", src / "arr_coc", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # sdist, then the wheel from the unpacked sdist: package data missing from either fails here.
    # --no-isolation: the build backend (setuptools) is this interpreter's; isolation would download it.
    run(sys.executable, "-m", "build", "--no-isolation", "--outdir", work / "dist", src, cwd=work, env=env)
    (wheel,) = (work / "dist").glob("arr_coc-*.whl")
    venv = work / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=work, env=env)
    bin_dir = venv / "bin"
    purelib = Path(run(bin_dir / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                       cwd=work, env=env).strip())
    (purelib / "arr_coc_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run(sys.executable, "-m", "pip", "--python", bin_dir / "python", "install", "--no-deps", "--no-index", "-q", wheel,
        cwd=work, env=env)
    elsewhere = work / "elsewhere"
    elsewhere.mkdir()
    return bin_dir, elsewhere, env


def test_the_package_comes_from_the_wheel_and_its_requirements_are_met(installed):
    bin_dir, elsewhere, env = installed
    out = run(bin_dir / "python", "-c", "import json, os, sys, arr_coc, arr_coc.weights.catalog as r; "
              "from arr_coc.engine.channels.objects import CLASS_NAMES_FILE, imagenet_class_names as names; "
              "print(arr_coc.__file__); print(r.PACKAGED); print(json.dumps([os.path.realpath(p) for p in sys.path])); "
              "print(CLASS_NAMES_FILE, len(names()), names()[281])", cwd=elsewhere, env=env).splitlines()
    venv = bin_dir.parent
    assert Path(out[0]).is_relative_to(venv) and Path(out[1]).is_relative_to(venv)
    classes, count, tabby = out[3].split()
    assert Path(classes).is_relative_to(venv) and (count, tabby) == ("1000", "tabby")
    assert str(ROOT) not in json.loads(out[2])  # the checkout's package is not importable
    # every requirement the wheel declares (extras aside) is met; `pip check` would also judge the
    # environment's other packages (lmms-eval, installed --no-deps by make setup, lacks torchvision on purpose)
    unmet = run(bin_dir / "python", "-c", CHECK_REQUIREMENTS, cwd=elsewhere, env=env).splitlines()
    assert unmet[0].startswith(str(venv)) and unmet[1:] == []
    assert run(bin_dir / "arr-coc", "--version", cwd=elsewhere, env=env).strip() == f"arr-coc {VERSION}"


def test_the_bundled_images_are_found_by_name_from_the_wheel(installed):
    bin_dir, elsewhere, env = installed
    out = run(bin_dir / "python", "-c", "from arr_coc import examples; print(examples.names()); "
              "print(examples.path('receipt.jpg'))", cwd=elsewhere, env=env).splitlines()
    assert out[0] == "['form.jpg', 'photo.jpg', 'receipt.jpg']"
    found = Path(out[1])
    assert found.is_relative_to(bin_dir.parent) and found.read_bytes() == (ROOT / "examples" / "receipt.jpg").read_bytes()
    # with no --out, look's picture goes to out/ under the folder it runs in
    run(bin_dir / "arr-coc", "look", str(found), "What is the total?", "--query-encoder", "hashing", "--saccades", "8",
        cwd=elsewhere, env=env)
    assert (elsewhere / "out" / "receipt_arr.png").stat().st_size > 0 and not (found.parent / "receipt_arr.png").exists()


def test_look_on_an_image_copied_elsewhere_uses_the_shipped_weights(installed):
    bin_dir, elsewhere, env = installed
    shutil.copy(ROOT / "examples" / "receipt.jpg", elsewhere / "mine.jpg")
    out = json.loads(run(bin_dir / "arr-coc", "look", "mine.jpg", "What is the total?", "--json", "--out", "mine.png",
                         cwd=elsewhere, env=env))
    assert out["tokens"] == {"gestalt": 256, "saccades": 273, "sent": 529, "full_resolution": 1855}
    assert len(out["positions"]) == 273 and (elsewhere / "mine.png").stat().st_size > 0
    assert out["positions"][0][0] == 38  # the TOTAL row: the trained scorer, not a hand-set or random one


def test_ask_with_a_tiny_model_and_a_missing_data_folder(installed):
    bin_dir, elsewhere, env = installed
    shutil.copy(ROOT / "examples" / "form.jpg", elsewhere / "form.jpg")
    out = json.loads(run(bin_dir / "arr-coc", "ask", "form.jpg", "What is the date?", "--model", "tiny:qwen2_5_vl",
                         "--saccades", "16", "--max-new-tokens", "2", "--json", cwd=elsewhere, env=env))
    assert out["tokens"]["sent"] == 32 and out["tokens"]["gestalt"] == 16  # 4x4 gestalt + 16 saccades
    # evaluation data has no default outside a checkout: one actionable line
    done = subprocess.run([str(bin_dir / "python"), "-c", "from arr_coc.data.datasets import default_root; "
                           "default_root('funsd')"], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert done.returncode == 1 and "pass --data DIR or set ARR_COC_DATA" in done.stderr.splitlines()[-1]


def test_serve_answers_with_the_bundled_examples(installed):
    bin_dir, elsewhere, env = installed
    import urllib.request

    with server("--query-encoder", "hashing", command=[str(bin_dir / "arr-coc")], cwd=elsewhere, env=env) as url:
        with urllib.request.urlopen(url + "config", timeout=30) as r:
            config = r.read().decode()
        with urllib.request.urlopen(url, timeout=30) as r:
            assert r.status == 200
    for name in ("receipt.jpg", "form.jpg", "photo.jpg"):  # the examples, found as package data
        assert name in config
