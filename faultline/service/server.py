"""Running the service under uvicorn with the connection limits of the settings.

uvicorn closes an idle kept-alive connection after `timeout_keep_alive`, but it never times out a
connection that has not yet sent a complete request head: a client that connects and sends nothing,
or trickles its headers a byte at a time, would hold the connection for ever. `GuardedH11Protocol`
gives every request head `header_timeout_s` (from the connection's start, or from the end of the
previous response); past it the connection is closed. Request bodies are timed by the middleware
(408). `limit_concurrency` bounds open connections (503 past it) and `h11_max_incomplete_event_size`
the size of a request head.
"""

from __future__ import annotations

import asyncio
import ssl as ssl_module

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from faultline.service.settings import Settings

MAX_HEAD_BYTES = 64 << 10


class GuardedH11Protocol(H11Protocol):
    header_timeout_s = 10.0  # set per server by protocol_for()

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._arm_head_timer()

    def _arm_head_timer(self) -> None:
        if getattr(self, "_head_timer", None) is None:
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timeout)

    def _disarm_head_timer(self) -> None:
        if getattr(self, "_head_timer", None) is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.logger.info("closing a connection that sent no complete request head in %g s", self.header_timeout_s)
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        waiting_for_head = self.conn.their_state is h11.IDLE
        if waiting_for_head:
            self._arm_head_timer()  # a kept-alive connection starting its next request head
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm_head_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # arms uvicorn's keep-alive timer for the idle connection

    def connection_lost(self, exc) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)


def protocol_for(settings: Settings) -> type[H11Protocol]:
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"header_timeout_s": settings.header_timeout_s})


def uvicorn_config(app, settings: Settings, host: str = "127.0.0.1", port: int = 8080, log_level: str = "info",
                   ssl_certfile: str | None = None, ssl_keyfile: str | None = None,
                   ssl_ca_certs: str | None = None, ssl_client_cert_required: bool = False) -> uvicorn.Config:
    """uvicorn's config for the service: its HTTP protocol with head timeouts, keep-alive, connection limit,
    and TLS when a certificate is given (mutual TLS when client certificates are required)."""
    tls = {}
    if ssl_certfile:
        tls = {"ssl_certfile": ssl_certfile, "ssl_keyfile": ssl_keyfile, "ssl_ca_certs": ssl_ca_certs,
               "ssl_cert_reqs": ssl_module.CERT_REQUIRED if ssl_client_cert_required else ssl_module.CERT_NONE}
    # The service logs one line per request itself; uvicorn's access log would repeat it.
    return uvicorn.Config(app, host=host, port=port, http=protocol_for(settings), access_log=False,
                          log_level=log_level, lifespan="on", timeout_keep_alive=settings.keep_alive_s,
                          limit_concurrency=settings.max_connections,
                          h11_max_incomplete_event_size=MAX_HEAD_BYTES, **tls)
