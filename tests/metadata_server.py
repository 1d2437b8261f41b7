"""A GCE metadata server on loopback for the tests: what jax and bert_jax ask a TPU VM's
(`GCE_METADATA_IP=<server.address>` points them at it). Like the real one it answers only
requests with `Metadata-Flavor: Google`, and 404 for keys it does not have; it records each path
it was asked."""
import http.server
import threading
from typing import Dict, Optional

ROOT = "/computeMetadata/v1/"


class MetadataServer:
  """`values`: {path under computeMetadata/v1/: text}, e.g. {"instance/preempted": "FALSE"};
  change them while it runs with `set`."""

  def __init__(self, values: Optional[Dict[str, str]] = None):
    self.values = dict(values or {})
    self.asked = []
    self._lock = threading.Lock()
    server = self

    class Handler(http.server.BaseHTTPRequestHandler):
      def do_GET(self):   # noqa: N802 (http.server's name)
        path = self.path.split("?", 1)[0]
        with server._lock:   # pylint: disable=protected-access
          server.asked.append(path[len(ROOT):] if path.startswith(ROOT) else path)
          value = server.values.get(path[len(ROOT):]) if path.startswith(ROOT) else None
        if self.headers.get("Metadata-Flavor") != "Google":
          self._answer(403, "Missing Metadata-Flavor:Google header.")
        elif value is None:
          self._answer(404, "Not found")
        else:
          self._answer(200, value)

      def _answer(self, code, text):
        body = text.encode()
        self.send_response(code)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Type", "application/text")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

      def log_message(self, *args):   # quiet
        pass

    self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self._server.daemon_threads = True
    self.address = f"127.0.0.1:{self._server.server_address[1]}"
    self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

  def set(self, path: str, value: str) -> None:
    with self._lock:
      self.values[path] = value

  def __enter__(self) -> "MetadataServer":
    self._thread.start()
    return self

  def __exit__(self, *exc):
    self._server.shutdown()
    self._server.server_close()
