"""What serve and the RPC worker both ask of an address they listen on."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """Only this machine can reach it (anything else gets a warning: no encryption)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
