"""Image URLs, fetched once into the data cache while the data is checked, never during training steps.

A URL is fetched with a total time limit (connect to last byte, across redirects), a size cap, only over http and
https on every redirect hop, and never from a loopback, private, link-local or otherwise non-public address unless
`data.allow_private_urls` is set: each hop's host is resolved, every address it resolves to is checked, and the
connection goes to a checked address (so a second DNS answer cannot swap in another). Proxies from the environment
are not used, since a proxy would resolve the host itself and the check would mean nothing.

The bytes are stored as `<data cache>/urls/<hash of the URL>`; every later use (another row with the same URL, the
next run, each training step) reads that file. A URL that fails raises FetchError with the reason, and the data
check skips its rows with it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.client
import ipaddress
import os
import socket
import ssl
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

# Largest image download. Any real training image fits (a 100-megapixel JPEG is ~30 MB); a response past this is an
# endless or hostile one, and stopping there bounds the disk a row can fill.
MAX_IMAGE_BYTES = 50 << 20
# Seconds one URL may take from connecting to its last byte, redirects included: long enough for 50 MiB at ~1 MB/s,
# short enough that a server dripping bytes costs the data check one minute, not a run.
TOTAL_TIMEOUT_S = 60.0
# Seconds any single wait (connect, one read) may take before the server counts as gone.
READ_TIMEOUT_S = 15.0
# Redirects followed per URL; image hosts use one or two (http -> https, a CDN).
MAX_REDIRECTS = 5
# Bytes per read: small enough that the size cap and the time limit are checked often.
_CHUNK = 1 << 16
_SCHEMES = ("http", "https")
# What each kind of refused address is called in messages, checked in this order (loopback and link-local
# addresses are also "private" to ipaddress, so the more telling word comes first).
_ADDRESS_KINDS = (
    ("is_loopback", "a loopback address"),
    ("is_link_local", "a link-local address"),
    ("is_unspecified", "an unspecified address"),
    ("is_multicast", "a multicast address"),
    ("is_private", "a private-network address"),
    ("is_reserved", "a reserved address"),
)


class FetchError(Exception):
    """A URL could not be fetched; the message says why, in words for the data report."""


class UrlFetcher:
    """Fetches image URLs into `folder`, once each, under the limits above.

    Per-split state lives here: a URL that failed is not tried again by later rows of the same check (a dead host
    used by a thousand rows costs one timeout).

    Args:
        folder: where fetched files go (`<data cache>/urls`).
        allow_private: data.allow_private_urls: also fetch from loopback, private and link-local hosts.
        total_timeout_s, max_bytes, max_redirects: the limits (the module constants unless a test sets smaller ones).
    """

    def __init__(
        self,
        folder: Path,
        *,
        allow_private: bool = False,
        total_timeout_s: float = TOTAL_TIMEOUT_S,
        max_bytes: int = MAX_IMAGE_BYTES,
        max_redirects: int = MAX_REDIRECTS,
    ):
        self.folder, self.allow_private = Path(folder), allow_private
        self.total_timeout_s, self.max_bytes, self.max_redirects = total_timeout_s, max_bytes, max_redirects
        self._failed: dict[str, str] = {}

    def path_for(self, url: str) -> Path:
        """Where the bytes of `url` are (or will be) stored."""
        return self.folder / hashlib.blake2b(url.encode(), digest_size=16).hexdigest()

    def fetch(self, url: str) -> Path:
        """The local file holding `url`'s bytes, fetching them first unless an earlier run or row already did.

        Raises:
            FetchError: refused or failed; the message says why.
        """
        target = self.path_for(url)
        if target.is_file():
            return target
        if url in self._failed:
            raise FetchError(self._failed[url])
        try:
            self._download(url, target)
        except FetchError as e:
            self._failed[url] = str(e)
            raise
        return target

    def refusal(self, host: str, address: str, port: int) -> str | None:
        """Why connecting to `address` (what `host` resolved to) is refused, or None to allow it.

        A method so that a test can treat one local server as a public host and check that the next redirect hop is
        still checked.
        """
        if self.allow_private:
            return None
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        named = host if host == address else f"{host} resolves to {address}, which"
        for attribute, words in _ADDRESS_KINDS:
            if getattr(ip, attribute):
                return (
                    f"{named} is {words}; set data.allow_private_urls = true to fetch from hosts on this machine "
                    "or network"
                )
        if not ip.is_global:
            return f"{named} is not a public address; set data.allow_private_urls = true to fetch from it"
        return None

    def _download(self, url: str, target: Path) -> None:
        watch = _Watchdog(self.total_timeout_s)
        opener = urllib.request.OpenerDirector()  # only these two handlers: no proxies, files, ftp or data URLs
        opener.add_handler(_CheckedHTTPHandler(self, watch))
        opener.add_handler(_CheckedHTTPSHandler(self, watch))
        try:
            with watch:
                response = self._follow(opener, url, watch)
                with response:
                    self._save(response, target, watch)
        except FetchError:
            raise
        except urllib.error.URLError as e:
            raise FetchError(watch.why_failed(e.reason)) from None
        except (OSError, http.client.HTTPException, ValueError) as e:
            raise FetchError(watch.why_failed(e)) from None

    def _follow(self, opener: urllib.request.OpenerDirector, url: str, watch: _Watchdog):
        """The final response for `url`, each redirect's target checked before it is requested."""
        for hop in range(self.max_redirects + 1):
            scheme = urllib.parse.urlsplit(url).scheme.lower()
            if scheme not in _SCHEMES:
                raise FetchError(
                    f"it redirects to {_short(url)}; only http and https redirects are followed"
                    if hop
                    else "only http and https URLs are fetched"
                )
            request = urllib.request.Request(url, headers={"User-Agent": "Hone", "Accept": "image/*"})
            response = opener.open(request, timeout=max(0.01, min(READ_TIMEOUT_S, watch.remaining())))
            if watch.expired:  # the watchdog cut the headers short; what was parsed means nothing
                response.close()
                raise FetchError(watch.too_slow())
            status = response.status
            location = response.headers.get("Location")
            if 300 <= status < 400 and location:
                response.close()  # the body of a redirect is never read: it may be endless
                url = urllib.parse.urljoin(url, location.strip())
                continue
            if status != 200:
                response.close()
                raise FetchError(f"the server answered {status} {response.reason}".rstrip())
            return response
        raise FetchError(f"it redirects more than {self.max_redirects} times")

    def _save(self, response, target: Path, watch: _Watchdog) -> None:
        """Stream the body into `target` (through a temporary file, renamed into place when complete)."""
        length = response.headers.get("Content-Length", "").strip()
        if length.isdigit() and int(length) > self.max_bytes:
            raise FetchError(f"it is {int(length):,} bytes, more than the {self.max_bytes:,}-byte limit for an image")
        self.folder.mkdir(parents=True, exist_ok=True)
        handle, tmp = tempfile.mkstemp(prefix=f".{target.name}-", dir=self.folder)
        try:
            with os.fdopen(handle, "wb") as out:
                size = 0
                while chunk := response.read1(_CHUNK):
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise FetchError(f"it sent more than the {self.max_bytes:,}-byte limit for an image")
                    if watch.remaining() <= 0:
                        raise FetchError(watch.too_slow())
                    out.write(chunk)
            if watch.expired:  # the watchdog's shutdown looks like the end of the body to the reader
                raise FetchError(watch.too_slow())
            if length.isdigit() and size < int(length):
                raise FetchError(f"the connection closed after {size:,} of {int(length):,} bytes")
            if size == 0:
                raise FetchError("the server sent an empty response")
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


class _Watchdog:
    """The total time limit of one URL: a timer that shuts the open sockets down when time is up, so no read (not
    even a header line dripped a byte at a time) can outlast it."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self._timer.cancel()

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if not self.expired:
                return
        self._shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            self._shut(sock)

    @staticmethod
    def _shut(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            # The plain socket's shutdown (an SSLSocket's own would drop its TLS state under a reading thread).
            socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def too_slow(self) -> str:
        return f"it took longer than {self.seconds:g} s in total (the limit for one image URL)"

    def why_failed(self, error: object) -> str:
        """Words for an error raised while fetching."""
        if self.expired or self.remaining() <= 0:
            return self.too_slow()
        if isinstance(error, FetchError):
            return str(error)
        if isinstance(error, (socket.timeout, TimeoutError)):
            return f"the server did not answer within {READ_TIMEOUT_S:g} s"
        text = str(getattr(error, "strerror", None) or error).strip()
        return f"{text or type(error).__name__} ({type(error).__name__})"


def _resolve(host: str, port: int, seconds: float) -> list:
    """socket.getaddrinfo with a time limit: the system resolver has none of its own (a dead DNS server can hold
    it for minutes), so it runs on a daemon thread that is left behind if it does not answer in time."""
    answer: dict = {}

    def lookup() -> None:
        try:
            answer["infos"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as e:
            answer["error"] = e

    thread = threading.Thread(target=lookup, name=f"resolve {host}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise FetchError(f"the host {host} could not be resolved within {seconds:g} s (DNS did not answer)")
    if "error" in answer:
        raise answer["error"]
    return answer["infos"]


def _checked_connection(
    fetcher: UrlFetcher, watch: _Watchdog, address: tuple[str, int], timeout=None, source_address=None
) -> socket.socket:
    """socket.create_connection, but to an address of the host that `fetcher.refusal` accepts."""
    host, port = address
    if watch.remaining() <= 0:
        raise FetchError(watch.too_slow())
    try:
        infos = _resolve(host, port, min(READ_TIMEOUT_S, max(0.01, watch.remaining())))
    except socket.gaierror as e:
        raise FetchError(f"the host {host} cannot be resolved ({e.strerror})") from None
    addresses = list(dict.fromkeys(info[4][0] for info in infos))
    for ip in addresses:  # every address, not only the first: DNS may answer differently next time
        why = fetcher.refusal(host, ip, port)
        if why is not None:
            raise FetchError(why)
    error: OSError | None = None
    for ip in addresses:
        try:
            sock = socket.create_connection(
                (ip, port), min(timeout or READ_TIMEOUT_S, max(0.01, watch.remaining())), source_address
            )
        except OSError as e:
            error = e
            continue
        watch.watch(sock)
        return sock
    raise error or FetchError(f"the host {host} has no address")


class _CheckedHTTPConnection(http.client.HTTPConnection):
    def __init__(self, *args, fetcher: UrlFetcher, watch: _Watchdog, **kwargs):
        super().__init__(*args, **kwargs)
        self._create_connection = functools.partial(_checked_connection, fetcher, watch)


class _CheckedHTTPSConnection(http.client.HTTPSConnection):
    _context: ssl.SSLContext  # HTTPSConnection's own (private, so typeshed does not declare it)

    def __init__(self, *args, fetcher: UrlFetcher, watch: _Watchdog, **kwargs):
        super().__init__(*args, **kwargs)
        self._create_connection = functools.partial(_checked_connection, fetcher, watch)
        self._watch = watch

    def connect(self) -> None:
        """HTTPSConnection.connect (no proxy tunnel here), with the TLS socket watched before its handshake: wrapping
        takes the plain socket's descriptor, so the watchdog must hold the new socket to stop a slow handshake."""
        http.client.HTTPConnection.connect(self)
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self.host, do_handshake_on_connect=False)
        self._watch.watch(self.sock)
        self.sock.do_handshake()


class _CheckedHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, fetcher: UrlFetcher, watch: _Watchdog):
        super().__init__()
        self._connection = functools.partial(_CheckedHTTPConnection, fetcher=fetcher, watch=watch)

    def http_open(self, req):
        return self.do_open(self._connection, req)


class _CheckedHTTPSHandler(urllib.request.HTTPSHandler):
    _context: ssl.SSLContext | None  # HTTPSHandler's own (private, so typeshed does not declare it)

    def __init__(self, fetcher: UrlFetcher, watch: _Watchdog):
        super().__init__()
        self._connection = functools.partial(_CheckedHTTPSConnection, fetcher=fetcher, watch=watch)

    def https_open(self, req):
        return self.do_open(self._connection, req, context=self._context)


def _short(url: str, limit: int = 80) -> str:
    return url if len(url) <= limit else url[: limit - 3] + "..."
