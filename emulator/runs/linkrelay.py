"""The TLS relay of a run's link to the home's service (runs/servicelink.py says why the link is
there): from where the run's nodes reach this machine to the service's link port on its loopback.
Apart from servicelink.py: asyncio is imported only by a run that has a service to link to."""
from __future__ import annotations

import asyncio
import socket
import ssl
import threading

from amlemu.runs.relay import LOOPBACK, pipe


class ServiceLink:
    """A TLS relay from a listening socket (where the nodes reach this machine) to the service's
    link port on this machine's loopback."""

    def __init__(self, listener: socket.socket, service_port: int, server: ssl.SSLContext,
                 client: ssl.SSLContext) -> None:
        self.listener, self.service_port, self.server_ctx, self.client_ctx = listener, service_port, server, client
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(lambda loop, context: None)  # a client that hangs up is no error
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, name="amlemu-service-link", daemon=True)

    def start(self) -> int:
        self.listener.setblocking(False)
        self._server = self.loop.run_until_complete(asyncio.start_server(self._relay, sock=self.listener,
                                                                         ssl=self.server_ctx))
        self.port = self.listener.getsockname()[1]
        self._thread.start()
        return self.port

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(LOOPBACK, self.service_port, ssl=self.client_ctx,
                                                                 server_hostname=LOOPBACK)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(close(), self.loop).result(timeout=10)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
        self.loop.close()
        self.listener.close()
