"""What every corpus case must end in: a correct result, or one line that says what was wrong.

A bad input raises one of the user-error types (``ValueError``, ``TypeError`` for a wrong type, ``OSError``,
:class:`arr_coc.errors.UserError`) with a one-line message; anything else is a bug and propagates with
its traceback, failing the test.
"""
from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any, Callable

from arr_coc.cli import main
from arr_coc.errors import UserError

USER_ERRORS = (ValueError, TypeError, OSError, UserError)


def outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    """("ok", result) or ("error", message); asserts the message is one non-empty line."""
    try:
        return "ok", fn()
    except USER_ERRORS as err:
        message = str(err)
        assert message.strip() and "\n" not in message.strip(), f"not one line: {message!r}"
        assert "Traceback" not in message
        return "error", message


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``arr-coc argv`` in this process; a bug's traceback propagates."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse: usage line + one error line, exit 2
            code = exit_.code if isinstance(exit_.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def assert_cli_outcome(code: int, stderr: str) -> None:
    """Exit 0, or exit 2 ending in the one ``arr-coc...: error: ...`` line (no traceback)."""
    assert "Traceback" not in stderr
    if code == 0:
        return
    assert code == 2, (code, stderr)
    last = stderr.strip().splitlines()[-1]  # after argparse's usage, or a library's log line
    assert last.startswith("arr-coc") and ": error: " in last, stderr


def write_bar_pages(folder: Path, *, image_ids: bool) -> Path:
    """Six 112 x 84 px pages with a black bar, two questions each, as ``folder/d.jsonl`` (ids optional)."""
    import json

    from PIL import Image, ImageDraw

    lines = []
    for i in range(6):
        img = Image.new("L", (112, 84), 255)
        ImageDraw.Draw(img).rectangle((8 + 6 * i, 20, 60 + 6 * i, 30), fill=0)
        img.save(folder / f"p{i}.png")
        for q, box in (("Where is the bar?", [8 + 6 * i, 20, 60 + 6 * i, 30]), ("And the corner?", [0, 0, 20, 20])):
            record = {"image": f"p{i}.png", "question": q, "answer": "", "boxes": [box]}
            lines.append(json.dumps({**record, "image_id": f"p{i}"} if image_ids else record))
    (folder / "d.jsonl").write_text("\n".join(lines) + "\n")
    return folder / "d.jsonl"
