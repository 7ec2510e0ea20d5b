"""A real database the test can make unreachable and bring back, without touching its server.

PostgreSQL is reached through a TCP relay on loopback: down() closes the relay's port and cuts
every connection through it, up() listens again on the same port. SQLite is reached through a
symbolic link to its directory: down() removes the link, so connections opened after it fail
("unable to open database file") while the file itself is untouched.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa


class TcpRelay:
    """Forward a loopback port to a target address until switched off."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]

    def up(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def down(self) -> None:
        if self._listener is not None:
            # shutdown() wakes the thread blocked in accept(); close() alone would not on Linux.
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                downstream, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                downstream.close()
                continue
            with self._lock:
                self._conns += [downstream, upstream]
            for a, b in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)


class DatabaseSwitch:
    """A database URL that points at `database` while up and at nothing while down."""

    def __init__(self, url: str, tmp_path: Path):
        parsed = sa.make_url(url)
        self._relay: TcpRelay | None = None
        self._link: tuple[Path, Path] | None = None
        if parsed.get_backend_name() == "sqlite":
            assert parsed.database is not None
            real = Path(parsed.database)
            link = tmp_path / "db-link"
            self._link = (link, real.parent)
            self.url = f"sqlite:///{link / real.name}"
        else:
            self._relay = TcpRelay((parsed.host or "127.0.0.1", parsed.port or 5432))
            self.url = parsed.set(host="127.0.0.1", port=self._relay.port).render_as_string(
                hide_password=False
            )
        self.is_up = False

    def up(self) -> None:
        if self._relay is not None:
            self._relay.up()
        elif self._link is not None:
            self._link[0].symlink_to(self._link[1], target_is_directory=True)
        self.is_up = True

    def down(self) -> None:
        if self._relay is not None:
            self._relay.down()
        elif self._link is not None:
            self._link[0].unlink(missing_ok=True)
        self.is_up = False


@contextlib.contextmanager
def switchable(url: str, tmp_path: Path) -> Iterator[DatabaseSwitch]:
    """Yield a switch for the database at url, down to begin with; switch it off after."""
    switch = DatabaseSwitch(url, tmp_path)
    try:
        yield switch
    finally:
        switch.down()
