"""``arr-coc serve``: the microscope, a web page to see and steer the allocation (Gradio)."""
from __future__ import annotations

import argparse
from typing import Callable

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


def run(args: argparse.Namespace) -> int:
    import os

    import torch

    from arr_coc.app.service import Microscope
    from arr_coc.app.ui import serve
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
    vlm = None
    if args.model:
        from arr_coc.vlm import load_vlm

        vlm = load_vlm(args.model)
    encoder = opt.query_encoder(args)
    print(f"arr-coc microscope on http://{host}:{args.port}/ (Ctrl+C stops it)", flush=True)
    serve(Microscope(query_encoder=encoder, vlm=vlm, max_new_tokens=args.max_new_tokens), host=host, port=args.port)
    return 0
