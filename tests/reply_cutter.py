"""A TCP proxy in front of a server that can lose a reply: armed, it forwards the next request that holds a given
byte string, then closes the client's connection instead of forwarding the reply (the server did the work; the client
never hears of it). While `down`, it closes every new connection at once. For the store tests: what a Redis that
went away just after a write looks like to its client."""
from __future__ import annotations

import socket
import threading


class ReplyCutter:
    def __init__(self, port: int) -> None:
        self.upstream = ("127.0.0.1", port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.cut_after: bytes | None = None   # arm: the reply to the next request holding these bytes is lost
        self.cut = threading.Event()          # a reply was lost
        self.down = False
        self.down_after_cut_s = 0.0           # and then every connection is closed at once for that long
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.down:
                client.close()
                continue
            server = socket.create_connection(self.upstream)
            cutting = threading.Event()   # this connection's reply to come is to be lost
            threading.Thread(target=self._requests, args=(client, server, cutting), daemon=True).start()
            threading.Thread(target=self._replies, args=(server, client, cutting), daemon=True).start()

    def _requests(self, client: socket.socket, server: socket.socket, cutting: threading.Event) -> None:
        try:
            while data := client.recv(65536):
                with self._lock:
                    if self.cut_after is not None and self.cut_after in data:
                        self.cut_after = None
                        cutting.set()
                server.sendall(data)
        except OSError:
            pass
        finally:
            server.close()

    def _replies(self, server: socket.socket, client: socket.socket, cutting: threading.Event) -> None:
        try:
            while data := server.recv(65536):
                if cutting.is_set():
                    if self.down_after_cut_s:
                        self.down = True
                        threading.Timer(self.down_after_cut_s, setattr, (self, "down", False)).start()
                    self.cut.set()
                    client.shutdown(socket.SHUT_RDWR)
                    return
                client.sendall(data)
        except OSError:
            pass
        finally:
            client.close()
            server.close()
