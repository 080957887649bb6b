"""How the local server runs: address, key, exposure and bounds, checked before it starts.

Safe by default: it binds the loopback address; any other address refuses to start
without an API key (a server on the network without a key would let anyone there use
the models). Request bodies and `max_tokens` are bounded.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass

from engine.errors import UsageError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
LOOPBACK_NAMES = ("localhost",)


@dataclass(frozen=True)
class ServeConfig:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_key: str | None = None
    variants: tuple[str, ...] | None = None  # None: every base and variant
    max_sessions: int = 4
    cors_origin: str | None = None
    max_body_bytes: int = 4 << 20
    max_tokens: int = 4096  # the most a request may ask for
    queue_limit: int = 32  # requests in flight before 429

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise UsageError(f"port {self.port} out of range (0..65535)")
        if self.api_key is not None and (len(self.api_key) < 8 or not self.api_key.isprintable()
                                         or any(c.isspace() for c in self.api_key)):
            raise UsageError("the API key must be at least 8 printable characters, no spaces")
        if not is_loopback(self.host) and not self.api_key:
            raise UsageError(f"refusing to listen on {self.host} without --api-key: only the "
                             "loopback address is safe without one")
        if not 1 <= self.max_sessions <= 64:
            raise UsageError("--max-sessions must be 1..64")
        if self.cors_origin is not None and (self.cors_origin == "*" or "://" not in
                                             self.cors_origin):
            raise UsageError("--cors-origin takes one origin such as http://localhost:3000 "
                             "(not '*')")
        for name in ("max_body_bytes", "max_tokens", "queue_limit"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1 or \
                    not math.isfinite(value):
                raise UsageError(f"{name} must be a positive whole number")

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
