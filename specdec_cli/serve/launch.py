"""Starting and stopping `specdec serve`: its options, the listening socket (bound before the
models load), the loaded pair and its slots, the model thread, and uvicorn around the app
(server.py)."""

from __future__ import annotations

import contextlib
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass

import uvicorn
from rich.console import Console

from .. import render
from ..decoding.history import DEFAULT_HISTORY_TOKENS
from ..errors import SpecdecError
from ..models.loading import ModelLoader, ModelPair, load_with_llama_cpp
from ..network import is_loopback
from ..request import DecodeRequest
from ..services.lifecycle import Slot, loaded_pair
from ..services.tool_calls import template_speaks_tools
from . import render_serve
from .guard import Guard
from .model_thread import ModelThread
from .render_serve import RequestLog
from .server import ServerState, create_app

SERVE_CONTEXT = 8192  # without --ctx-size: room for an editor's file and a long answer


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8080
    api_keys: tuple[str, ...] = ()  # none: no authentication; each key its own history
    max_queue: int = 16
    json_log: bool = False
    # Earlier prompts and answers kept in memory to draft from (0: none); see README.
    history_tokens: int = DEFAULT_HISTORY_TOKENS
    parallel: int = 1  # requests answered side by side, their rows sharing each pass
    allowed_hosts: tuple[str, ...] = ()  # Host names a loopback server answers besides its own
    allowed_origins: tuple[str, ...] = ()  # web pages that may call it ("*": any); guard.py

    def guard(self) -> Guard:
        return Guard.for_bind(is_loopback(self.host), self.allowed_hosts, self.allowed_origins)


@dataclass(frozen=True)
class ServeRequest:
    decode: DecodeRequest  # the models, and the defaults for what a request leaves out
    options: ServeOptions
    aliases: tuple[str, ...] = ()  # more names requests may give the model (--target as typed)


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, model_thread: ModelThread) -> None:
        super().__init__(config)
        self._model_thread = model_thread

    def handle_exit(self, sig, frame) -> None:
        # End the answers in progress now, so open streams close and shutdown is quick.
        self._model_thread.stop_all()
        super().handle_exit(sig, frame)
        # uvicorn raises the signal again once it has shut down (so Ctrl-C would end in a
        # KeyboardInterrupt and SIGTERM in death by signal); for a server, being told to
        # stop is the normal way to end: shut down, then exit 0.
        self._captured_signals.clear()

    def stop(self) -> None:
        """Shut down as on Ctrl-C, from another thread."""
        self._model_thread.stop_all()
        self.should_exit = True


@dataclass(frozen=True)
class Listening:
    """A started server, for a caller that runs `serve` in a thread: where, and how to stop."""

    url: str
    stop: Callable[[], None]


def serve(
    request: ServeRequest,
    loader: ModelLoader = load_with_llama_cpp,
    on_listening: Callable[[Listening], None] | None = None,
) -> int:
    options = request.options
    console = render.stderr_console()
    if not is_loopback(options.host):
        render_serve.print_network_warning(console, options.host, bool(options.api_keys))
    sock = _listen(options.host, options.port)
    with contextlib.ExitStack() as lifetime:
        lifetime.callback(sock.close)
        loading = console.status("loading models…", spinner="dots")
        with loading if console.is_terminal else contextlib.nullcontext():
            loaded = lifetime.enter_context(loaded_pair(request.decode, loader))
            loaded.prepare(SERVE_CONTEXT)
            slots = loaded.slots(options.parallel)
        return _run_server(request, loaded.pair, slots, sock, console, on_listening)


def _run_server(
    request: ServeRequest,
    pair: ModelPair,
    slots: list[Slot],
    sock: socket.socket,
    console: Console,
    on_listening: Callable[[Listening], None] | None,
) -> int:
    options = request.options
    model_thread = ModelThread(
        slots, max_queue=options.max_queue, history_tokens=options.history_tokens
    )
    log = RequestLog(sys.stderr, json_lines=options.json_log)
    state = ServerState(
        model_thread,
        request.decode,
        aliases=request.aliases,
        api_keys=options.api_keys,
        log=log,
        speaks_tools=template_speaks_tools(pair.target.chat_template()),
        context_tokens=pair.target.n_ctx,
    )
    config = uvicorn.Config(
        create_app(state, options.guard()),
        log_level="warning",
        access_log=False,
        lifespan="off",
        server_header=False,
        timeout_graceful_shutdown=5,
    )
    server = _Server(config, model_thread)
    model_thread.start()
    host = f"[{options.host}]" if ":" in options.host else options.host
    url = f"http://{host}:{sock.getsockname()[1]}"
    render_serve.print_listening(console, url, state.model_id, request.decode.drafter_label)
    if on_listening is not None:
        on_listening(Listening(url, server.stop))
    try:
        server.run(sockets=[sock])
    finally:
        model_thread.close()
    console.print("specdec serve: stopped", highlight=False)
    return 0 if server.started else 1


def _listen(host: str, port: int) -> socket.socket:
    """Bind before loading the models: a port in use fails at once, and requests that
    arrive while the models load wait in the backlog."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as error:
        raise SpecdecError(
            f"cannot listen on {host}:{port}: {error.strerror or error}.",
            "Pick another --port (0: any free port), or stop what is using it.",
        ) from None
    return sock
