"""``arr-coc serve``: the microscope, a web page to see and steer the allocation (Gradio).

The server owns one temporary folder: Gradio's uploads and cached outputs go in ``uploads/`` (its
``GRADIO_TEMP_DIR``, set in this process only, which the server owns), the JSON and PNG downloads in
``downloads/``. SIGTERM and SIGINT stop the server and the folder goes with it.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

from arr_coc.cli import options as opt

HELP = "the microscope: a web page to see and steer the allocation (Gradio)"


def add_parser(command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command("serve", [], help=HELP,
                description="Serve the microscope: upload an image, ask, and see where the saccades go, what each "
                            "part of the scorer contributed, and what the VLM would see.")
    p.add_argument("--model", default=None, metavar="PATH_OR_ID",
                   help="a VLM to answer with (as for ask; tiny:<family> for the random-weight plumbing model); "
                        "default: no answer, allocation only")
    opt.max_new_tokens_option(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s: this machine only)")
    p.add_argument("--port", type=int, default=7860, help="port (default %(default)s)")
    opt.query_encoder_option(p)
    opt.retriever_option(p)
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads of the server process (default: torch's choice); 1 keeps "
                        "answers quick on a machine that is busy with other work")


def bind_host(host: str, port: int) -> str:
    """``--host`` resolved before the server starts, as the web server takes it (an IPv6 address in brackets).

    Raises:
        ValueError: the name does not resolve (one line naming the host, not the port).
    """
    import ipaddress
    import socket

    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        socket.getaddrinfo(bare, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as err:
        reason = getattr(err, "strerror", None) or str(err)
        raise ValueError(f"--host {host!r} cannot be resolved ({reason}); give a name or address of this machine, "
                         f"e.g. 127.0.0.1, ::1 or 0.0.0.0") from None
    try:
        ipv6 = ipaddress.ip_address(bare).version == 6
    except ValueError:  # a name, not an address
        ipv6 = False
    return f"[{bare}]" if ipv6 else bare  # Gradio writes http://HOST:PORT: an IPv6 address needs its brackets


def _stop(signum: int, frame: Any) -> None:
    """SIGTERM as Ctrl+C: Gradio's main loop closes the server and the ``with`` blocks remove their folders."""
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def server_folders() -> Iterator[Path]:
    """The server's temporary folder, Gradio's upload folder inside it, and stop signals that remove both.

    Yields the folder; on leaving, the previous ``GRADIO_TEMP_DIR`` and signal handlers are put back.
    """
    previous = {s: signal.signal(s, _stop) for s in (signal.SIGTERM, signal.SIGINT)}
    env = os.environ.get("GRADIO_TEMP_DIR")
    try:
        with tempfile.TemporaryDirectory(prefix="arr-coc-serve-") as work:
            (Path(work) / "uploads").mkdir()
            # Gradio reads its upload folder from this variable when it builds the page and its routes
            os.environ["GRADIO_TEMP_DIR"] = str(Path(work) / "uploads")
            yield Path(work)
    finally:
        if env is None:
            os.environ.pop("GRADIO_TEMP_DIR", None)
        else:
            os.environ["GRADIO_TEMP_DIR"] = env
        for s, handler in previous.items():
            signal.signal(s, handler)


def run(args: argparse.Namespace) -> int:
    import torch

    from arr_coc.config import check_int
    from arr_coc.threads import fit_threads

    if not 1 <= args.port <= 65535:
        raise ValueError(f"--port must be a TCP port in 1..65535, got {args.port}")
    check_int("--max-new-tokens", args.max_new_tokens)
    host = bind_host(args.host, args.port)
    if args.threads is not None:
        check_int("--threads", args.threads, 1)
        if args.threads > (os.cpu_count() or 1) * 8:
            raise ValueError(f"--threads {args.threads} is far above this machine's {os.cpu_count()} cores")
        torch.set_num_threads(args.threads)  # this process is the server: its thread pool is its own to size
        fit_threads()  # but never above OMP_THREAD_LIMIT, where half-precision matmul goes wrong
    with server_folders() as work:
        # imported here: Gradio reads GRADIO_TEMP_DIR when it is imported, too (a folder of its own otherwise)
        from arr_coc.app.service import Microscope
        from arr_coc.app.ui import serve

        vlm = None
        if args.model:
            from arr_coc.vlm import load_vlm

            vlm = load_vlm(args.model)
        scope = Microscope(query_encoder=opt.query_encoder(args), vlm=vlm, max_new_tokens=args.max_new_tokens,
                           retriever=opt.retriever(args))
        print(f"arr-coc microscope on http://{host}:{args.port}/ (Ctrl+C stops it; files in {work})", flush=True)
        try:
            serve(scope, host=host, port=args.port, workdir=work)
        except KeyboardInterrupt:  # a stop signal before Gradio's own loop took it (at start-up): still a stop
            print("arr-coc microscope stopped", flush=True)
    return 0
