"""llama.cpp's RPC protocol, the part specdec checks itself before llama.cpp connects.

llama.cpp aborts the whole process when a worker cannot be reached or speaks another
protocol version, so `check_workers` opens each endpoint first and says in one line what is
wrong. The handshake is llama.cpp's HELLO: | command 14 (1 byte) | size (8 bytes, little
endian) | 24 bytes of transport capabilities | -> | size (8 bytes) | major, minor, patch,
padding (4 bytes) | 24 bytes of capabilities |. All-zero capabilities ask for plain TCP.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from collections.abc import Iterable

from ..errors import BadUsageError, SpecdecError

# The RPC protocol of the pinned llama.cpp (ggml/include/ggml-rpc.h): a worker must speak
# the same major version and no newer minor one (llama.cpp's own rule).
PROTOCOL = (7, 0, 0)
MAX_WORKERS = 16  # GGML_RPC_MAX_SERVERS
DEFAULT_PORT = 50052  # llama.cpp's rpc-server default
HANDSHAKE_SECONDS = 10.0

_HELLO = 14
_CAPS_SIZE = 24
_HELLO_REPLY = struct.Struct("<Q4B")


class WorkerError(SpecdecError):
    """A worker named by --rpc cannot serve this run."""


def parse_endpoints(text: str) -> tuple[str, ...]:
    """`HOST:PORT[,HOST:PORT...]` as given to --rpc, checked; order kept (it is the order in
    which the workers take the target's layers)."""
    endpoints = tuple(part.strip() for part in text.split(",") if part.strip())
    if not endpoints:
        raise BadUsageError(
            "--rpc needs at least one HOST:PORT.", "For example --rpc 127.0.0.1:50052."
        )
    if len(endpoints) > MAX_WORKERS:
        raise BadUsageError(f"--rpc names {len(endpoints)} workers; llama.cpp takes {MAX_WORKERS}.")
    if len(set(endpoints)) != len(endpoints):
        raise BadUsageError(f"--rpc names a worker twice: {text}.", "Name each HOST:PORT once.")
    for endpoint in endpoints:
        split_endpoint(endpoint)
    return endpoints


def split_endpoint(endpoint: str) -> tuple[str, int]:
    host, _, port_text = endpoint.rpartition(":")
    if not host or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise BadUsageError(
            f"'{endpoint}' is not HOST:PORT.",
            "Write the worker as HOST:PORT, e.g. 192.168.1.20:50052.",
        )
    if ":" in host or host.startswith("["):
        raise BadUsageError(
            f"'{endpoint}': llama.cpp's RPC client takes IPv4 addresses and host names only.",
            "Use the worker's IPv4 address or name.",
        )
    return host, int(port_text)


def parse_tensor_split(text: str, n_workers: int) -> tuple[float, ...]:
    """--tensor-split '3,1': the share of the target's layers each worker holds, in --rpc order."""
    try:
        shares = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise BadUsageError(
            f"--tensor-split '{text}' is not a list of numbers.", "For example --tensor-split 3,1."
        ) from None
    if len(shares) != n_workers or any(share < 0 for share in shares) or sum(shares) <= 0:
        raise BadUsageError(
            f"--tensor-split '{text}' needs one share per --rpc worker ({n_workers}), none "
            "negative and not all zero.",
            "For example --tensor-split 3,1 for two workers, the first holding three quarters.",
        )
    return shares


def hello(endpoint: str, timeout: float = HANDSHAKE_SECONDS) -> tuple[int, int, int]:
    """The worker's protocol version, from a HELLO on a connection of our own (closed again,
    so the worker goes back to waiting for llama.cpp's)."""
    host, port = split_endpoint(endpoint)
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(bytes([_HELLO]) + struct.pack("<Q", _CAPS_SIZE) + bytes(_CAPS_SIZE))
            reply = _receive(sock, _HELLO_REPLY.size + _CAPS_SIZE)
    except ConnectionRefusedError:
        raise WorkerError(
            f"no worker at {endpoint}: connection refused.",
            f"Start one there with `specdec worker --port {port}`, or correct --rpc.",
        ) from None
    except TimeoutError:
        raise WorkerError(
            f"the worker at {endpoint} did not answer within {timeout:.0f} s.",
            "A worker serves one client at a time: is another run using it? Otherwise check "
            "the address and the network.",
        ) from None
    except OSError as exc:
        raise WorkerError(
            f"cannot reach the worker at {endpoint}: {exc.strerror or exc}."
        ) from None
    size, major, minor, patch, _ = _HELLO_REPLY.unpack_from(reply)
    if size != 4 + _CAPS_SIZE:
        raise WorkerError(
            f"{endpoint} answered, but not as a llama.cpp RPC worker of protocol "
            f"{version_text(PROTOCOL)} (a reply of {size} bytes to the handshake).",
            "Check the port; start workers with `specdec worker` from the same install.",
        )
    return major, minor, patch


def _receive(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise WorkerError(
                f"{sock.getpeername()[0]}:{sock.getpeername()[1]} closed the connection during "
                "the handshake: it is not a llama.cpp RPC worker of this protocol, or it is "
                "shutting down.",
                "Start workers with `specdec worker` from the same install as the client.",
            )
        data += chunk
    return data


def compatible(worker: tuple[int, int, int], client: tuple[int, int, int] = PROTOCOL) -> bool:
    return worker[0] == client[0] and worker[1] <= client[1]


def version_text(version: tuple[int, int, int]) -> str:
    return ".".join(str(part) for part in version)


def check_workers(endpoints: Iterable[str]) -> None:
    """Every worker answers the handshake with a protocol this client speaks, or one line says
    which does not and why."""
    for endpoint in endpoints:
        version = hello(endpoint)
        if not compatible(version):
            raise WorkerError(
                f"the worker at {endpoint} speaks llama.cpp RPC protocol {version_text(version)}, "
                f"this client {version_text(PROTOCOL)}.",
                "Install the same specdec build (the same llama.cpp) on both machines.",
            )


def unreachable(endpoints: Iterable[str], timeout: float = 1.0) -> list[str]:
    """The workers that refuse a connection now: after a failure mid-answer, the ones to name."""
    gone = []
    for endpoint in endpoints:
        host, port = split_endpoint(endpoint)
        try:
            socket.create_connection((host, port), timeout=timeout).close()
        except OSError:
            gone.append(endpoint)
    return gone


def check_listen_address(host: str, port: int) -> None:
    """The worker can listen there: an IPv4 address (llama.cpp's server takes no names) and a
    port that can be bound (llama.cpp would only print 'Failed to create server socket')."""
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        raise BadUsageError(
            f"--host '{host}' is not an IPv4 address; llama.cpp's RPC server takes no names.",
            "Use 127.0.0.1 (this machine only), this machine's LAN address, or 0.0.0.0 (all).",
        ) from None
    if not 1 <= port <= 65535:
        raise BadUsageError(f"--port {port} is not a TCP port.", "Pick one in 1-65535.")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
    except OSError as exc:
        raise WorkerError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}.",
            "Pick another --port, or stop what uses this one.",
        ) from None
