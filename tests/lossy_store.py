"""A Cloud Storage emulator that loses chosen writes: fake-gcs-server (tests/test_cloud_storage.py)
behind a small HTTP proxy on loopback, for `STORAGE_EMULATOR_HOST`.

Every request is passed on as it came. Once the emulator has answered a write into an object whose
name matches `lose` (an upload, or a copy or rewrite into it) with success, the proxy deletes that
object, then passes the success on: the writer is told its write succeeded, and the store does not
hold it, as a store that acknowledges a write it then loses. Nothing of bert_jax is replaced.
"""
import contextlib
import http.client
import http.server
import json
import re
import threading
import urllib.parse
from typing import Iterator, List

_HOP_BY_HOP = {"transfer-encoding", "expect", "content-length", "connection", "keep-alive",
               "proxy-connection"}


class LossyStore:
  """The proxy: `url` is what `STORAGE_EMULATOR_HOST` names; `lost` the objects it deleted."""

  def __init__(self, emulator_url: str, lose: str):
    self.upstream = urllib.parse.urlsplit(emulator_url)
    self.lose = re.compile(lose)
    self.lost: List[str] = []
    self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
    self._server.daemon_threads = True
    self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
    threading.Thread(target=self._server.serve_forever, daemon=True).start()

  def close(self) -> None:
    self._server.shutdown()
    self._server.server_close()

  def _forward(self, method: str, path: str, headers, body: bytes):
    connection = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port,
                                            timeout=60)
    try:
      connection.request(method, path, body=body, headers=headers)
      response = connection.getresponse()
      return response.status, response.reason, response.getheaders(), response.read()
    finally:
      connection.close()

  def _lose_if_chosen(self, method: str, status: int, data: bytes) -> None:
    """Deletes the object a successful write just made, if its name is one to lose."""
    if method not in ("POST", "PUT") or not 200 <= status < 300:
      return
    try:
      answer = json.loads(data)
    except ValueError:
      return
    written = answer.get("resource", answer) if isinstance(answer, dict) else {}
    name, bucket = written.get("name"), written.get("bucket")
    if not (isinstance(name, str) and bucket and self.lose.search(name)):
      return
    quoted = urllib.parse.quote(name, safe="")
    self._forward("DELETE", f"/storage/v1/b/{bucket}/o/{quoted}", {}, b"")
    self.lost.append(name)

  def _handler(self):
    store = self

    class Handler(http.server.BaseHTTPRequestHandler):
      protocol_version = "HTTP/1.1"   # keep-alive, as the relay in front expects

      def log_message(self, *args):   # quiet
        pass

      def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
          body = b""
          while True:
            size = int(self.rfile.readline().split(b";")[0], 16)
            if size == 0:
              self.rfile.readline()
              return body
            body += self.rfile.read(size)
            self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length", 0)))

      def _relay(self):
        body = self._body()
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        status, reason, answer, data = store._forward(self.command, self.path, headers, body)
        store._lose_if_chosen(self.command, status, data)
        self.send_response(status, reason)
        for key, value in answer:
          if key.lower() in _HOP_BY_HOP:
            continue
          if key.lower() == "location":   # an upload session: back through this proxy
            value = value.replace(store.upstream.netloc, urllib.parse.urlsplit(store.url).netloc)
          self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
          self.wfile.write(data)

      do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _relay

    return Handler


@contextlib.contextmanager
def lossy_store(emulator_url: str, lose: str) -> Iterator[LossyStore]:
  store = LossyStore(emulator_url, lose)
  try:
    yield store
  finally:
    store.close()
