"""`STORAGE_EMULATOR_HOST` for every storage layer: all `gs://` paths go to a local emulator.

Google's client libraries read `STORAGE_EMULATOR_HOST=http://127.0.0.1:PORT` (e.g. a
fake-gcs-server). The layers bert_jax stores through each need their own setting, made here from
that one variable before they are first used:

* TensorStore (Orbax's array storage): `TENSORSTORE_GCS_HTTP_URL` is the endpoint, and
  `GOOGLE_AUTH_TOKEN_FOR_TESTING` a fixed token instead of Google credentials (TensorFlow reads
  the same token).
* TensorFlow's GCS filesystem (tf.io.gfile, tf.data, TensorBoard, and etils epath, which uses it)
  has no endpoint setting: it always calls https://storage.googleapis.com and
  https://www.googleapis.com. It does honour `https_proxy` and `CURL_CA_BUNDLE`, so a small relay
  process (`Relay`) answers as those hosts with a certificate of its own throw-away CA and passes
  each HTTP request on to the emulator. It runs in a process of its own because TensorFlow holds
  the GIL while some of its writes wait for the network, which would stall a relay thread in
  the same interpreter, and it ends with the process that started it (its stdin closes).
  TensorFlow reads objects through the XML API (`https://storage.googleapis.com/BUCKET/OBJECT`),
  which fake-gcs-server serves only under its `-public-host`; the relay sends those reads to the
  JSON API's media download instead, so any `-public-host` / `-external-url` works.
* TensorFlow's stat and block caches are turned off, so that several processes (hosts) see each
  other's writes at once, as they do on real Cloud Storage.

Nothing here runs unless `STORAGE_EMULATOR_HOST` is set, and then it says so once on stderr,
naming the variable and the emulator: a variable left set from a test must not send a real run's
`gs://` paths to plain HTTP unnoticed. The fixed token goes to the emulator only: a variable
naming one of Google's own hosts is an error, and a child process started without the variable
drops the settings its parent made for an emulator (`configure`). The relay needs the
`cryptography` package (`pip install "bert_jax[emulator]"`).
"""
import asyncio
import datetime
import http.client
import ipaddress
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.parse
from typing import Dict, Optional

ENV = "STORAGE_EMULATOR_HOST"
_RELAY_FOR = "BERT_JAX_STORAGE_RELAY_FOR"   # the emulator a running relay serves (inherited)
_GOOGLE_HOSTS = ("storage.googleapis.com", "www.googleapis.com", "oauth2.googleapis.com",
                 "*.googleapis.com", "*.storage.googleapis.com")
_relay: Optional[subprocess.Popen] = None


# The variables `configure` set for an emulator, with the values they had before (JSON, null:
# unset): a child process inherits them, and puts those values back when it runs without
# `STORAGE_EMULATOR_HOST`, so that its gs:// paths go to Cloud Storage with its own
# credentials, never with the emulator's fixed token.
_DERIVED = "BERT_JAX_EMULATOR_DERIVED"
_warned_for: Optional[str] = None   # the emulator this process has warned about


def emulator_url() -> Optional[str]:
  """`STORAGE_EMULATOR_HOST` as `http://host:port` (no trailing slash), or None. An emulator on
  one of Google's own hosts is an error: the fixed token is for an emulator only."""
  host = os.environ.get(ENV, "").strip()
  if not host:
    return None
  url = (host if "://" in host else "http://" + host).rstrip("/")
  name = (urllib.parse.urlsplit(url).hostname or "").lower()
  if name.endswith(("googleapis.com", ".google.com")):
    raise ValueError(f"{ENV}={host} names Google's own host {name}: {ENV} is for a local Cloud "
                     "Storage emulator (e.g. http://127.0.0.1:4443), reached with a fixed test "
                     f"token instead of credentials. Unset {ENV} to use Cloud Storage.")
  return url


def configure(timeout_secs: float = 60.0) -> None:
  """Points each layer's own setting at the emulator, if `STORAGE_EMULATOR_HOST` is set, and
  says so once on stderr (a variable left set from a test would otherwise send every gs:// path
  to it, silently); without it, drops what a parent process set for its emulator.

  `timeout_secs`: how long the relay waits for the emulator's answer to a request (after that
  it answers 504, which the caller retries; `remote_storage` sets the callers' budgets).
  Idempotent; a child process inherits the settings and the parent's relay."""
  url = emulator_url()
  if url is None:
    for name, before in json.loads(os.environ.pop(_DERIVED, "{}")).items():
      if before is None:
        os.environ.pop(name, None)
      else:
        os.environ[name] = before
    return
  _warn_once(url)
  settings = {
      "TENSORSTORE_GCS_HTTP_URL": url,
      "NO_GCE_CHECK": "true",                     # never probe the GCE metadata server
      "GCS_STAT_CACHE_MAX_AGE": "0",
      "GCS_MATCHING_PATHS_CACHE_MAX_AGE": "0",
      "GCS_READ_CACHE_MAX_SIZE_MB": "0",
  }
  if "GOOGLE_AUTH_TOKEN_FOR_TESTING" not in os.environ:
    settings["GOOGLE_AUTH_TOKEN_FOR_TESTING"] = "emulator"
  if not (os.environ.get(_RELAY_FOR) == url and os.environ.get("https_proxy")):
    port, ca_file = _start_relay(url, timeout_secs)
    proxy = f"http://127.0.0.1:{port}"
    no_proxy = "127.0.0.1,localhost"
    settings.update({"https_proxy": proxy, "HTTPS_PROXY": proxy, "no_proxy": no_proxy,
                     "NO_PROXY": no_proxy, "CURL_CA_BUNDLE": ca_file, _RELAY_FOR: url})
  # else: a relay for this emulator already serves this process tree
  before = json.loads(os.environ.get(_DERIVED, "{}"))
  for name in settings:
    before.setdefault(name, os.environ.get(name))
  os.environ.update(settings)
  os.environ[_DERIVED] = json.dumps(before, sort_keys=True)


def _warn_once(url: str) -> None:
  global _warned_for
  if _warned_for == url:
    return
  _warned_for = url
  print(f"WARNING: {ENV}={os.environ[ENV].strip()} is set: every gs:// path goes to the storage "
        f"emulator at {url} (plain HTTP, a fixed test token), not to Cloud Storage. Unset {ENV} "
        "to use Cloud Storage.", file=sys.stderr, flush=True)


def _start_relay(url: str, timeout_secs: float):
  global _relay
  try:
    import cryptography  # noqa: F401  (checked here: the relay process needs it)
  except ImportError as e:
    raise ImportError(f"{ENV} is set, and the relay that sends TensorFlow's Cloud Storage calls "
                      "to the emulator needs the cryptography package: "
                      "pip install 'bert_jax[emulator]'") from e
  _relay = subprocess.Popen([sys.executable, "-m", "bert_jax.io.storage_emulator", url,
                             str(timeout_secs)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
  ready = json.loads(_relay.stdout.readline())
  return ready["port"], ready["ca_file"]


# ------------------------------------------------------------------------------ the relay


def _certificates(directory: pathlib.Path):
  """(CA file, certificate, key): a throw-away CA and a certificate for Google's API hosts."""
  from cryptography import x509
  from cryptography.hazmat.primitives import hashes, serialization
  from cryptography.hazmat.primitives.asymmetric import ec
  from cryptography.x509.oid import NameOID
  now = datetime.datetime.now(datetime.timezone.utc)
  start, end = now - datetime.timedelta(days=1), now + datetime.timedelta(days=30)
  ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
  ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bert_jax storage emulator CA")])
  ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                     False), True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256()))
  names = [x509.DNSName(h) for h in _GOOGLE_HOSTS] + [
      x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
  leaf = (x509.CertificateBuilder()
          .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, _GOOGLE_HOSTS[0])]))
          .issuer_name(ca_name).public_key(key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(start).not_valid_after(end)
          .add_extension(x509.SubjectAlternativeName(names), False)
          .add_extension(x509.BasicConstraints(ca=False, path_length=None), True)
          .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), False)
          .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
              ca_key.public_key()), False)
          .sign(ca_key, hashes.SHA256()))
  pem = serialization.Encoding.PEM
  paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
  paths[0].write_bytes(ca.public_bytes(pem))
  paths[1].write_bytes(leaf.public_bytes(pem))
  paths[2].write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption()))
  return paths


class Relay:
  """An HTTPS proxy (CONNECT) that answers as Google's API hosts and relays to the emulator.

  TensorFlow's client sends `Transfer-Encoding: identity` and `Expect: 100-continue` on uploads,
  which the emulator's Go HTTP server refuses; each request is re-sent with a plain
  Content-Length, and an upload session's `Location` is pointed back at the proxied host.
  A request the emulator does not answer within `timeout_secs` is answered 504, one it refuses
  502: errors the caller retries with its own backoff, where a dropped connection or a wait with
  no end would not tell it what happened.
  """

  def __init__(self, url: str, timeout_secs: float = 60.0):
    import concurrent.futures
    import ssl
    parsed = urllib.parse.urlparse(url)
    self.host, self.port_upstream, self.netloc = parsed.hostname, parsed.port or 80, parsed.netloc
    self.directory = pathlib.Path(tempfile.mkdtemp(prefix="bert_jax_storage_relay_"))
    self.ca_file, certificate, key = _certificates(self.directory)
    self.tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    self.tls.load_cert_chain(certificate, key)
    self.port = None
    self.timeout = timeout_secs
    # Requests wait for the emulator in threads; enough of them that requests stuck in an
    # outage never hold up new ones once it is over (asyncio's default pool has cores + 4).
    self.pool = concurrent.futures.ThreadPoolExecutor(64, thread_name_prefix="relay")

  async def serve(self, ready) -> None:
    server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
    self.port = server.sockets[0].getsockname()[1]
    ready()
    async with server:
      await server.serve_forever()

  async def _connection(self, reader, writer):
    try:
      head = await reader.readuntil(b"\r\n\r\n")
      method, target = head.split(b" ", 2)[:2]
      host = target.decode().rpartition(":")[0]
      if method != b"CONNECT" or not host.endswith("googleapis.com"):
        writer.write(b"HTTP/1.1 403 only Google API hosts\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        return
      writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
      await writer.drain()
      await writer.start_tls(self.tls)
      await self._relay_requests(host, reader, writer)
    except (ConnectionError, asyncio.IncompleteReadError, OSError):
      pass
    finally:
      writer.close()

  async def _read_body(self, reader, headers: Dict[str, str]) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
      body = b""
      while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
          await reader.readuntil(b"\r\n")
          return body
        body += await reader.readexactly(size)
        await reader.readexactly(2)
    return await reader.readexactly(int(headers.get("content-length", 0)))

  async def _relay_requests(self, host: str, reader, writer):
    upstream = http.client.HTTPConnection(self.host, self.port_upstream, timeout=self.timeout)
    hop_by_hop = {"transfer-encoding", "expect", "content-length", "connection",
                  "proxy-connection", "keep-alive"}
    try:
      while True:
        try:
          head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
          return
        method, path, _ = head[0].split(" ", 2)
        if host == _XML_API_HOST:
          path = _media_download_path(path)
        pairs = [tuple(x.strip() for x in line.split(":", 1)) for line in head[1:] if line]
        headers = {k.lower(): v for k, v in pairs}
        if headers.get("expect", "").lower() == "100-continue":
          writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
          await writer.drain()
        body = await self._read_body(reader, headers)
        send = [(k, v) for k, v in pairs if k.lower() not in hop_by_hop]
        send.append(("Content-Length", str(len(body))))
        status, reason, answer, data = await asyncio.get_running_loop().run_in_executor(
            self.pool, self._forward, upstream, method, path, send, body)
        lines = [f"HTTP/1.1 {status} {reason}"]
        for k, v in answer:
          if k.lower() in hop_by_hop:
            continue
          if k.lower() == "location":   # an upload session: back through this relay
            parts = urllib.parse.urlsplit(v)
            if parts.netloc == self.netloc or (parts.hostname or "").endswith("googleapis.com"):
              v = urllib.parse.urlunsplit(("https", host) + tuple(parts)[2:])
          lines.append(f"{k}: {v}")
        if method != "HEAD":
          lines.append(f"Content-Length: {len(data)}")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if method != "HEAD":
          writer.write(data)
        await writer.drain()
    finally:
      upstream.close()

  @staticmethod
  def _forward(connection, method, path, headers, body):
    for attempt in range(2):   # the emulator may have closed an idle keep-alive connection
      try:
        connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for k, v in headers:
          connection.putheader(k, v)
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, response.reason, response.getheaders(), response.read()
      except TimeoutError:
        connection.close()   # the answer may still come: this connection is done with
        return 504, "Gateway Timeout", [], b"the storage emulator did not answer in time"
      except (http.client.HTTPException, OSError) as e:
        connection.close()
        if attempt:
          return 502, "Bad Gateway", [], f"the storage emulator: {e}".encode()

  def close(self) -> None:
    shutil.rmtree(self.directory, ignore_errors=True)


_XML_API_HOST = "storage.googleapis.com"
_JSON_API_PREFIXES = ("/storage/", "/upload/", "/download/")


def _media_download_path(path: str) -> str:
  """An XML-API object read (`/BUCKET/OBJECT`, how TensorFlow reads objects) as the JSON API's
  media download (`/download/storage/v1/b/BUCKET/o/OBJECT?alt=media`).

  fake-gcs-server answers XML-API reads only when the request's host is its `-public-host`
  (default `storage.googleapis.com`); started with another one (`-public-host 127.0.0.1:PORT`),
  every read of an object TensorFlow had just written was a 404. The JSON API does not depend
  on that flag.
  """
  target, _, query = path.partition("?")
  if target.startswith(_JSON_API_PREFIXES) or target.count("/") < 2:
    return path
  bucket, _, name = target[1:].partition("/")
  name = urllib.parse.quote(urllib.parse.unquote(name), safe="")
  return f"/download/storage/v1/b/{bucket}/o/{name}?alt=media" + (f"&{query}" if query else "")


def _serve(url: str, timeout_secs: float) -> None:
  """The relay process: prints {"port", "ca_file"} once listening; ends when stdin closes."""
  relay = Relay(url, timeout_secs)

  def ready():
    print(json.dumps({"port": relay.port, "ca_file": str(relay.ca_file)}), flush=True)

  def leave_with_parent():
    sys.stdin.read()   # EOF: the process that started the relay has ended
    relay.close()
    os._exit(0)  # pylint: disable=protected-access

  threading.Thread(target=leave_with_parent, daemon=True).start()
  asyncio.run(relay.serve(ready))


if __name__ == "__main__":
  _serve(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 60.0)
