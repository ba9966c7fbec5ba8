"""A run's relay to its services (runs/servicerun.py): each service gets a port of its own on this
machine's 127.0.0.1, and every connection accepted there is forwarded to the service on its node
(the backend's `connect_node`: into a process cluster's network namespace, or to a docker node's
address on its cluster network).

Why only this way round: the job is untrusted. The relay listens on 127.0.0.1 of this machine only
(a process node's loopback is its namespace's, a container's its own: neither reaches it), and it
connects only to the one node address and port it was given, so it opens nothing on this machine
to the job. It lives in the supervisor and stops with the run's services.
"""
from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable

LOOPBACK = "127.0.0.1"
CHUNK = 256 * 1024


class Relay:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(lambda loop, context: None)  # a client that hangs up is no error
        self._servers: list[asyncio.base_events.Server] = []
        self._thread = threading.Thread(target=self.loop.run_forever, name="amlemu-service-relay", daemon=True)
        self._thread.start()

    def add(self, connect: Callable[[], socket.socket]) -> int:
        """Listen on a free port of 127.0.0.1 and forward each connection to what `connect` opens
        (a blocking call, run off the loop); the port."""
        async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                sock = await self.loop.run_in_executor(None, connect)
                up_reader, up_writer = await asyncio.open_connection(sock=sock)
            except OSError:  # the service is not (or no longer) listening
                writer.close()
                return
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

        async def serve() -> asyncio.base_events.Server:
            server = await asyncio.start_server(relay, LOOPBACK, 0)
            self._servers.append(server)
            return server

        server = asyncio.run_coroutine_threadsafe(serve(), self.loop).result(timeout=10)
        return int(server.sockets[0].getsockname()[1])

    def stop(self) -> None:
        """Close every listener and connection; the port refuses from now on."""
        async def close() -> None:
            for server in self._servers:
                server.close()
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)  # each pipe closes its writer
            await asyncio.sleep(0)  # and the transports their sockets
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(close(), self.loop).result(timeout=10)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
        if not self.loop.is_running():
            self.loop.close()


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until either end closes (a TLS error is an OSError too), then close the writer."""
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()
