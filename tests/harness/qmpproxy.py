"""Stand-ins on a VM's QMP socket path, for tests that watch or break pvestord's QMP use.

- :class:`CountingQmpProxy` forwards every connection to QEMU's real socket
  (moved aside) and counts them: how many QMP connections pvestord makes;
- :class:`NeverAnsweringQmp` is a hung QEMU: a pidfile naming a live process
  whose command line carries it, and a socket that accepts and never greets.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path


class CountingQmpProxy:
    """Stands in for a VM's QMP socket path: a real unix socket that forwards
    every connection to QEMU's own socket (moved aside) and counts them.
    QEMU serves one client at a time; so does this proxy's upstream."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.upstream = path.with_name(path.name + ".real")
        os.rename(path, self.upstream)
        self.connections = 0
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        self._server.listen(16)
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="qmp-proxy").start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(str(self.upstream))
        except OSError:
            client.close()
            return
        def pump(src: socket.socket, dst: socket.socket) -> None:
            with contextlib.suppress(OSError):
                while data := src.recv(65536):
                    dst.sendall(data)
            # Either side's end ends the other's at once: QEMU serves the next
            # client only once this one is gone.
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

        back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
        back.start()
        pump(client, upstream)
        back.join(30)
        client.close()
        upstream.close()

    def close(self) -> None:
        self._closed = True
        self._server.close()


class NeverAnsweringQmp:
    """Stands in for a hung QEMU: a pidfile naming a live process whose command
    line carries it (as QEMU's does), and a real unix socket at ``<vmid>.qmp``
    that accepts connections and never sends the QMP greeting."""

    def __init__(self, run_dir: Path, vmid: int) -> None:
        pidfile = run_dir / f"{vmid}.pid"
        self.process = subprocess.Popen(  # noqa: S603 - argument list
            [sys.executable, "-c", "import time; time.sleep(3600)", "-pidfile", str(pidfile)])
        pidfile.write_text(f"{self.process.pid}\n")
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(run_dir / f"{vmid}.qmp"))
        self.server.listen(64)
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True, name="never-answering").start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.server.accept()
                self.accepted.append(conn)  # held open, never written to

    def close(self) -> None:
        self.server.close()
        for conn in self.accepted:
            conn.close()
        self.process.kill()
        self.process.wait(timeout=30)
