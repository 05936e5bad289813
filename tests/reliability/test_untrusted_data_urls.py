"""Image URLs in data rows against a real local HTTP server: endless, slow, huge and redirecting responses, and the
loopback refusal. Each URL is fetched once, during the data check, into the data cache; a failed one skips its row
with the reason (file:row, field, URL, why) and never stops the run."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hone.core.config import DataConfig
from hone.core.data import check_data, load_training_data
from hone.core.data.fetch import MAX_IMAGE_BYTES, FetchError, UrlFetcher
from hone.core.data.images import load_image

HUGE_BYTES = 60 << 20  # what /huge declares: past the 50 MiB cap
DRIP_S = 0.05  # seconds between the bytes of a dripping response


def _png_bytes(size=(40, 30), color="red") -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="PNG")
    return out.getvalue()


PNG = _png_bytes()


class LocalServer:
    """A real HTTP server on 127.0.0.1 (its own thread, one thread per request) that counts requests per path and
    bytes sent by the endless routes. `other` is the URL of a second server, for cross-port redirects."""

    def __init__(self):
        self.requests: Counter[str] = Counter()
        self.sent: Counter[str] = Counter()
        self.finished: dict[str, threading.Event] = {}
        self.stop = threading.Event()
        self.other = ""
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                server.requests[self.path] += 1
                done = server.finished.setdefault(self.path, threading.Event())
                try:
                    server.route(self)
                except OSError:  # the client hung up: what a refused response looks like from here
                    pass
                finally:
                    done.set()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        # shutdown() returns once serve_forever next checks for it, every poll_interval (0.5 s by default: a second
        # of teardown per test for the two servers).
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    def route(self, h: BaseHTTPRequestHandler) -> None:
        if h.path == "/img.png":
            self._reply(h, 200, {"Content-Type": "image/png", "Content-Length": str(len(PNG))}, PNG)
        elif h.path == "/endless":  # no length, never ends
            self._reply(h, 200, {"Content-Type": "image/png"})
            self._pour(h, h.path, None)
        elif h.path == "/huge":  # declares 60 MiB, then sends it
            self._reply(h, 200, {"Content-Type": "image/png", "Content-Length": str(HUGE_BYTES)})
            self._pour(h, h.path, HUGE_BYTES)
        elif h.path == "/drip":  # a body of 1,000 bytes, one byte per DRIP_S: 50 s in all
            self._reply(h, 200, {"Content-Type": "image/png", "Content-Length": "1000"})
            self._drip(h, b"x" * 1000)
        elif h.path == "/drip-headers":  # the header lines themselves, one byte per DRIP_S
            h.wfile.write(b"HTTP/1.1 200 OK\r\n")
            self._drip(h, b"X-Slow: " + b"a" * 1000 + b"\r\n\r\n")
        elif h.path == "/to-file":
            self._reply(h, 302, {"Location": "file:///etc/passwd", "Content-Length": "0"})
        elif h.path == "/to-other":
            self._reply(h, 302, {"Location": f"{self.other}/img.png", "Content-Length": "0"})
        elif h.path == "/loop":
            self._reply(h, 302, {"Location": "/loop", "Content-Length": "0"})
        else:
            self._reply(h, 404, {"Content-Length": "0"})

    @staticmethod
    def _reply(h, status, headers, body=b""):
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(body)

    def _pour(self, h, path, total):
        chunk = b"\0" * (1 << 16)
        while not self.stop.is_set() and (total is None or self.sent[path] < total):
            h.wfile.write(chunk)
            self.sent[path] += len(chunk)

    def _drip(self, h, data):
        for i in range(len(data)):
            if self.stop.is_set():
                return
            h.wfile.write(data[i : i + 1])
            h.wfile.flush()
            time.sleep(DRIP_S)

    def close(self):
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers():
    """(a, b): two local servers on different ports; a's /to-other redirects to b."""
    a, b = LocalServer(), LocalServer()
    a.other = b.url
    yield a, b
    a.close()
    b.close()


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """This test's own Hone cache (the data cache is cache_root("datasets") below it)."""
    monkeypatch.setenv("HONE_CACHE", str(tmp_path / "hone-cache"))
    return tmp_path / "hone-cache" / "datasets"


@pytest.fixture(scope="module")
def llava_processor(smollm2_tokenizer_dir):
    """A real transformers LlavaProcessor over the SmolLM2 tokenizer (as in tests/core/data), 15 tokens per image."""
    from transformers import AutoTokenizer, LlavaProcessor

    try:
        from transformers import CLIPImageProcessorPil as ImageProcessor
    except ImportError:
        from transformers import CLIPImageProcessor as ImageProcessor

    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    template = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' }}{% if m['content'] is string %}"
        "{{ m['content'] }}{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}{{ '<image>' }}"
        "{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}{{ '<|im_end|>\n' }}{% endfor %}"
    )
    images = ImageProcessor(size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56})
    return LlavaProcessor(
        image_processor=images,
        tokenizer=tok,
        patch_size=14,
        vision_feature_select_strategy="default",
        image_token="<image>",
        chat_template=template,
    )


def image_row(ref: str) -> dict:
    return {
        "messages": [
            {"role": "user", "content": [{"type": "image", "image": ref}, {"type": "text", "text": "Color?"}]},
            {"role": "assistant", "content": "Red."},
        ]
    }


def text_row() -> dict:
    return {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def fetch_error(fetcher: UrlFetcher, url: str) -> tuple[str, float]:
    start = time.monotonic()
    with pytest.raises(FetchError) as info:
        fetcher.fetch(url)
    return str(info.value), time.monotonic() - start


# --- the fetcher against each hostile response ---------------------------------------------------------------------


def test_endless_response_stops_at_the_size_cap(servers, tmp_path):
    a, _ = servers
    fetcher = UrlFetcher(tmp_path / "urls", allow_private=True)
    why, seconds = fetch_error(fetcher, f"{a.url}/endless")
    assert why == f"it sent more than the {MAX_IMAGE_BYTES:,}-byte limit for an image"
    assert MAX_IMAGE_BYTES == 50 << 20
    assert seconds < 30
    assert a.finished["/endless"].wait(10), "the client should have hung up"
    assert a.sent["/endless"] < MAX_IMAGE_BYTES + (32 << 20)  # the cap plus what socket buffers held
    assert list((tmp_path / "urls").iterdir()) == []  # the partial download is gone


def test_declared_huge_response_is_refused_before_its_body_is_read(servers, tmp_path):
    a, _ = servers
    fetcher = UrlFetcher(tmp_path / "urls", allow_private=True)
    why, _ = fetch_error(fetcher, f"{a.url}/huge")
    assert why == f"it is {HUGE_BYTES:,} bytes, more than the {MAX_IMAGE_BYTES:,}-byte limit for an image"
    assert a.finished["/huge"].wait(10)
    assert a.sent["/huge"] < MAX_IMAGE_BYTES // 2  # refused on the header, not after reading 50 MiB
    assert not (tmp_path / "urls").exists() or list((tmp_path / "urls").iterdir()) == []


@pytest.mark.parametrize("path", ["/drip", "/drip-headers"])
def test_slow_drip_is_stopped_by_the_total_timeout(servers, tmp_path, path):
    """Every read returns within DRIP_S, so only a limit on the whole fetch stops it (the body would take 50 s)."""
    a, _ = servers
    fetcher = UrlFetcher(tmp_path / "urls", allow_private=True, total_timeout_s=1.0)
    why, seconds = fetch_error(fetcher, f"{a.url}{path}")
    assert why == "it took longer than 1 s in total (the limit for one image URL)"
    assert 0.9 <= seconds < 4.0


def test_redirect_to_a_file_url_is_refused(servers, tmp_path):
    a, _ = servers
    fetcher = UrlFetcher(tmp_path / "urls", allow_private=True)
    why, _ = fetch_error(fetcher, f"{a.url}/to-file")
    assert why == "it redirects to file:///etc/passwd; only http and https redirects are followed"
    assert not (tmp_path / "urls").exists() or list((tmp_path / "urls").iterdir()) == []


def test_every_redirect_hop_is_checked(servers, tmp_path):
    """The first server stands for a public host; its redirect to another local port is refused without a request
    reaching that port. With private URLs allowed the same redirect is followed."""
    a, b = servers

    class FirstServerPublic(UrlFetcher):
        def refusal(self, host, address, port):
            return None if port == a.port else super().refusal(host, address, port)

    why, _ = fetch_error(FirstServerPublic(tmp_path / "refused"), f"{a.url}/to-other")
    assert why.startswith("127.0.0.1 is a loopback address; set data.allow_private_urls = true")
    assert (a.requests["/to-other"], b.requests["/img.png"]) == (1, 0)

    path = UrlFetcher(tmp_path / "allowed", allow_private=True).fetch(f"{a.url}/to-other")
    assert path.read_bytes() == PNG and b.requests["/img.png"] == 1


def test_redirect_loops_end(servers, tmp_path):
    a, _ = servers
    why, _ = fetch_error(UrlFetcher(tmp_path / "urls", allow_private=True), f"{a.url}/loop")
    assert why == "it redirects more than 5 times"
    assert a.requests["/loop"] == 6


def test_loopback_is_refused_by_default_without_a_request(servers, tmp_path):
    a, _ = servers
    fetcher = UrlFetcher(tmp_path / "urls")
    why, _ = fetch_error(fetcher, f"{a.url}/img.png")
    assert why == (
        "127.0.0.1 is a loopback address; set data.allow_private_urls = true to fetch from hosts on this "
        "machine or network"
    )
    why, _ = fetch_error(fetcher, f"http://localhost:{a.port}/img.png")
    assert why.startswith("localhost resolves to ") and "which is a loopback address" in why
    assert sum(a.requests.values()) == 0


@pytest.mark.parametrize(
    ("address", "words"),
    [
        ("127.0.0.1", "a loopback address"),
        ("127.8.9.10", "a loopback address"),
        ("::1", "a loopback address"),
        ("::ffff:127.0.0.1", "a loopback address"),
        ("169.254.169.254", "a link-local address"),
        ("fe80::1", "a link-local address"),
        ("10.1.2.3", "a private-network address"),
        ("172.16.0.1", "a private-network address"),
        ("192.168.1.1", "a private-network address"),
        ("fd00::1", "a private-network address"),
        ("0.0.0.0", "an unspecified address"),
        ("224.0.0.1", "a multicast address"),
        ("100.64.0.1", "not a public address"),
        ("93.184.215.14", None),
        ("2606:2800:21f:cb07:6820:80da:af6b:8b2c", None),
    ],
)
def test_address_policy(tmp_path, address, words):
    refused = UrlFetcher(tmp_path).refusal("host.example", address, 80)
    if words is None:
        assert refused is None
    else:
        assert refused is not None and f"host.example resolves to {address}, which is {words}" in refused
    assert UrlFetcher(tmp_path, allow_private=True).refusal("host.example", address, 80) is None


# --- through the data pipeline: the report, the cache, the run -------------------------------------------------------


def test_refused_url_skips_its_row_with_file_row_field_url_and_why(servers, tmp_path):
    a, _ = servers
    (tmp_path / "red.png").write_bytes(PNG)
    path = write_jsonl(tmp_path / "d.jsonl", [image_row("red.png"), image_row(f"{a.url}/img.png"), text_row()])
    report, _ = check_data(DataConfig(train=[str(path)]))
    assert (report.rows_read, report.rows_kept, report.skipped) == (3, 2, {"image URL not fetched": 1})
    assert report.skipped_examples == [
        f"{path}:2: image 1: image URL {a.url}/img.png was not fetched: 127.0.0.1 is a loopback address; set "
        "data.allow_private_urls = true to fetch from hosts on this machine or network"
    ]
    assert sum(a.requests.values()) == 0


def test_failed_urls_skip_only_their_rows_and_the_run_goes_on(servers, tmp_path, llava_processor):
    a, _ = servers
    rows = [
        image_row(f"{a.url}/img.png"),
        image_row(f"{a.url}/huge"),
        image_row(f"{a.url}/to-file"),
        image_row(f"{a.url}/nothing-here"),
        text_row(),
    ]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    data = load_training_data(
        DataConfig(train=[str(path)], allow_private_urls=True), llava_processor, cache_dir=tmp_path / "cache"
    )
    report = data.reports[0]
    assert (report.rows_read, report.rows_kept, report.skipped) == (5, 2, {"image URL not fetched": 3})
    assert report.skipped_examples == [
        f"{path}:2: image 1: image URL {a.url}/huge was not fetched: it is {HUGE_BYTES:,} bytes, more than the "
        f"{MAX_IMAGE_BYTES:,}-byte limit for an image",
        f"{path}:3: image 1: image URL {a.url}/to-file was not fetched: it redirects to file:///etc/passwd; only "
        "http and https redirects are followed",
        f"{path}:4: image 1: image URL {a.url}/nothing-here was not fetched: the server answered 404 Not Found",
    ]
    assert [row.source for row in data.train] == [f"{path}:1", f"{path}:5"]
    assert any("not cached, so the next run tries those URLs again" in note for note in report.notes)


def test_allowed_private_url_is_fetched_once_and_every_later_use_reads_the_cache(
    servers, tmp_path, own_cache, llava_processor
):
    a, _ = servers
    url = f"{a.url}/img.png"
    path = write_jsonl(tmp_path / "d.jsonl", [image_row(url), text_row(), image_row(url)])
    cfg = DataConfig(train=[str(path)], allow_private_urls=True, image_max_side=32)

    first = load_training_data(cfg, llava_processor, cache_dir=own_cache)
    assert (first.reports[0].rows_kept, first.reports[0].skipped) == (3, {})
    assert a.requests["/img.png"] == 1  # two rows, one URL: one request, during loading
    refs = [ref for row in first.train for ref in row.images]
    assert [(r.kind, r.value, r.width, r.height) for r in refs] == [("url", url, 40, 30)] * 2
    for _ in range(3):  # training steps: every use reads the cached copy
        assert [load_image(ref, 32).size for ref in refs] == [(32, 24)] * 2
    again = load_training_data(cfg, llava_processor, cache_dir=own_cache)  # the next run
    report, _ = check_data(cfg)  # `hone data check` (its data cache is the same folder)
    assert [r.images for r in again.train] == [r.images for r in first.train] and report.rows_kept == 3
    assert a.requests["/img.png"] == 1


def test_a_dns_server_that_never_answers_is_bounded_by_the_time_limit(tmp_path, monkeypatch):
    """The system resolver has no timeout of its own: a lookup that hangs costs the URL its time limit, no more."""
    import socket

    release = threading.Event()

    def hanging_lookup(*args, **kwargs):
        release.wait(30)
        raise socket.gaierror(-3, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", hanging_lookup)
    fetcher = UrlFetcher(tmp_path / "urls", total_timeout_s=1.0)
    start = time.monotonic()
    try:
        with pytest.raises(FetchError, match="could not be resolved within"):
            fetcher.fetch("http://images.example.org/cat.png")
    finally:
        release.set()
    assert time.monotonic() - start < 5
