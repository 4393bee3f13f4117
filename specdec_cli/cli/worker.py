"""`specdec worker`: a target's layers for another machine."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .. import render
from ..llama import rpc
from ..network import is_loopback
from .app import app, user_errors
from .options import ThreadsOpt, VerboseOpt


@app.command()
def worker(
    host: Annotated[
        str,
        typer.Option(
            "--host",
            help="The IPv4 address to listen on: 127.0.0.1 (default) is this machine only; "
            "anything else lets whoever reaches it use this machine (no authentication).",
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="The TCP port to listen on.")] = (
        rpc.DEFAULT_PORT
    ),
    threads: ThreadsOpt = None,
    tensor_cache: Annotated[
        Path | None,
        typer.Option(
            "--tensor-cache",
            file_okay=False,
            help="Keep the weights clients send in this folder, so the next load of the same "
            "model sends hashes instead of gigabytes.",
        ),
    ] = None,
    verbose: VerboseOpt = False,
) -> None:
    """Hold a target's layers for specdec on another machine (llama.cpp's RPC backend).

    Clients pass --rpc HOST:PORT. One client at a time; Ctrl-C stops the worker."""
    import signal

    from ..llama import devices, library

    with user_errors():
        rpc.check_listen_address(host, port)
        library.set_verbose(verbose)
        if not is_loopback(host):
            render.stderr_console().print(
                f"[bold yellow]warning:[/bold yellow] listening on {host}:{port}. llama.cpp's RPC "
                "protocol has no authentication or encryption: anyone who can reach this port "
                "can use this machine's memory and compute. Only do this on a network you trust, "
                "never on the internet.",
                soft_wrap=True,
            )
        render.stderr_console().print(
            f"specdec worker on {host}:{port}: {', '.join(devices.worker_device_names())}, "
            f"batch-invariant kernels up to {library.EXACT_BATCH_ROWS} rows (exact clients "
            "stay exact). Ctrl-C stops it.",
            soft_wrap=True,
        )
        if tensor_cache is not None:
            tensor_cache.mkdir(parents=True, exist_ok=True)
        # llama.cpp's server loop never returns to Python: let the signals stop the process
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        devices.serve_worker(host, port, threads, tensor_cache)
