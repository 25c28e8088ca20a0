"""Images from OpenAI content parts: `data:` URLs, `file://` paths under --allowed-local-media-path, http(s) URLs
from --allowed-media-domains, and PIL images given offline (docs/serving.md, "Images").

Every image comes back as an RGB PIL image (transparency composited on white, as vLLM does). Every way a part can
be wrong is a ValueError whose message starts with the part's place in the request
(`messages[1].content[0].image_url: ...`), so the server answers 400 naming it. What a client can make the server
do is bounded: encoded bytes (MAX_IMAGE_BYTES), pixels (MAX_IMAGE_PIXELS, checked from the header before
decoding), a fetch's time, and the decoders PIL may use (IMAGE_FORMATS); redirects are never followed, since
they could lead to a host the operator did not allow.
"""

from __future__ import annotations

import base64
import binascii
import io
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_jax.multimodal.config import MultiModalConfig

MAX_IMAGE_BYTES = 32 << 20  # an encoded image, from any source
MAX_IMAGE_PIXELS = 40_000_000  # width x height (8k x 5k); far beyond what any vision encoder reads
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")  # PIL's decoders that client data may reach


@dataclass(frozen=True)
class ImageSource:
    """One image of a request, not loaded yet: a URL, or a PIL image given offline; `where` names its part."""

    where: str
    url: str | None = None
    image: Any = None


def load_image(source: ImageSource, config: MultiModalConfig) -> Any:
    """The RGB PIL image `source` names; a ValueError naming the part when it cannot or may not be loaded."""
    if source.url is None:
        return _from_pil(source.image, source.where)
    url = source.url.strip()
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        return decode_image(_data_url_bytes(url, source.where), source.where)
    if scheme == "file":
        return decode_image(_read_local_file(url, config, source.where), source.where)
    if scheme in ("http", "https"):
        return decode_image(_fetch(url, config, source.where), source.where)
    raise ValueError(f"{source.where}: unsupported URL scheme {scheme or url[:16]!r}: send a data: URL "
                     "(base64 PNG, JPEG or WebP), or an http(s):// or file:// URL the server allows")


def decode_image(data: bytes, where: str) -> Any:
    """Encoded bytes as an RGB image, after checking their size and the pixel count in the header."""
    from PIL import Image, UnidentifiedImageError

    if len(data) > MAX_IMAGE_BYTES:
        raise ValueError(f"{where}: the image is {len(data)} bytes; at most {MAX_IMAGE_BYTES} bytes are accepted")
    try:
        img = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
    except Image.DecompressionBombError as exc:  # PIL's own pixel limit, checked from the header
        raise ValueError(f"{where}: the image has too many pixels: {exc}") from None
    except (UnidentifiedImageError, OSError, ValueError):
        raise ValueError(f"{where}: the data cannot be decoded as an image (not a valid "
                         f"{', '.join(IMAGE_FORMATS)} file)") from None
    _check_pixels(img, where)
    try:
        img.load()
        return to_rgb(img)
    except Exception as exc:  # noqa: BLE001 - a corrupt file can fail in any decoder: the client's data is wrong
        raise ValueError(f"{where}: the data cannot be decoded as an image ({img.format}): {exc}") from None


def to_rgb(img: Any) -> Any:
    """RGB, with any transparency composited on white (what vLLM's convert_image_mode does)."""
    from PIL import Image

    if img.mode == "RGB":
        return img
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        background = Image.new("RGB", rgba.size, (255, 255, 255))
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background
    return img.convert("RGB")


def _from_pil(image: Any, where: str) -> Any:
    from PIL import Image

    if not isinstance(image, Image.Image):
        raise ValueError(f"{where}: an image_pil part needs a PIL.Image.Image; got {type(image).__name__}")
    return to_rgb(image)


def _check_pixels(img: Any, where: str) -> None:
    width, height = img.size
    if width < 1 or height < 1:
        raise ValueError(f"{where}: the image is empty ({width}x{height})")
    if width * height > MAX_IMAGE_PIXELS:
        raise ValueError(f"{where}: the image is {width}x{height} pixels; at most {MAX_IMAGE_PIXELS} pixels are "
                         "accepted")


def _data_url_bytes(url: str, where: str) -> bytes:
    """`data:image/png;base64,....` -> the decoded bytes (base64 only, as vLLM accepts them)."""
    header, sep, payload = url.partition(",")
    if not sep:
        raise ValueError(f"{where}: a data: URL needs a ',' before its data (data:image/png;base64,...)")
    media_type, *params = header[len("data:"):].split(";")
    if "base64" not in (p.strip().lower() for p in params):
        raise ValueError(f"{where}: only base64 data: URLs are accepted (data:image/png;base64,...)")
    if media_type and not media_type.lower().startswith("image/"):
        raise ValueError(f"{where}: a data: URL of type {media_type!r} is not an image")
    if len(payload) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise ValueError(f"{where}: the image is larger than {MAX_IMAGE_BYTES} bytes")
    try:
        return base64.b64decode("".join(payload.split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"{where}: the data: URL is not valid base64: {exc}") from None


def _read_local_file(url: str, config: MultiModalConfig, where: str) -> bytes:
    root = config.allowed_local_media_path
    if not root:
        raise ValueError(f"{where}: file:// URLs are off; the server reads local files only under "
                         "--allowed-local-media-path")
    parsed = urllib.parse.urlparse(url)
    if parsed.netloc not in ("", "localhost"):
        raise ValueError(f"{where}: a file:// URL must name a local path (file:///path); got host {parsed.netloc!r}")
    path = Path(urllib.request.url2pathname(parsed.path))
    try:
        resolved = path.resolve(strict=True)  # symlinks and '..' resolved before the check
    except (OSError, RuntimeError):
        raise ValueError(f"{where}: no such file: {path}") from None
    if not resolved.is_relative_to(root):
        raise ValueError(f"{where}: {path} is outside --allowed-local-media-path ({root})")
    if not resolved.is_file():
        raise ValueError(f"{where}: {path} is not a file")
    try:
        size = resolved.stat().st_size
        if size > MAX_IMAGE_BYTES:
            raise ValueError(f"{where}: the image is {size} bytes; at most {MAX_IMAGE_BYTES} bytes are accepted")
        return resolved.read_bytes()
    except OSError as exc:  # unreadable (permissions), or gone since the check
        raise ValueError(f"{where}: {path} cannot be read: {exc.strerror}") from None


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> None:
        raise urllib.error.HTTPError(newurl, code, f"redirect to {newurl} refused", headers, fp)


def _fetch(url: str, config: MultiModalConfig, where: str) -> bytes:
    host = (urllib.parse.urlparse(url).hostname or "").lower().rstrip(".")
    if not config.allowed_media_domains:
        raise ValueError(f"{where}: fetching http(s) URLs is off; send the image as a data: URL, or start the "
                         f"server with --allowed-media-domains {host or 'HOST'}")
    if host not in config.allowed_media_domains:
        raise ValueError(f"{where}: host {host!r} is not in --allowed-media-domains")
    opener = urllib.request.build_opener(_NoRedirects)
    try:
        with opener.open(url, timeout=config.fetch_timeout_s) as resp:
            declared = resp.headers.get("Content-Length")
            if declared is not None and declared.isdigit() and int(declared) > MAX_IMAGE_BYTES:
                raise ValueError(f"{where}: the image is {declared} bytes; at most {MAX_IMAGE_BYTES} bytes are "
                                 "accepted")
            data = _read_until(resp, time.monotonic() + config.fetch_timeout_s, where)
    except urllib.error.HTTPError as exc:
        raise ValueError(f"{where}: fetching {url} failed: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:  # refused, unreachable, timed out
        raise ValueError(f"{where}: fetching {url} failed: {getattr(exc, 'reason', exc)}") from None
    return data


def _read_until(resp: Any, deadline: float, where: str) -> bytes:
    """The body, within the deadline as a whole (a socket timeout alone bounds each read, not a slow drip) and
    MAX_IMAGE_BYTES."""
    chunks, size = [], 0
    while chunk := resp.read(1 << 16):
        size += len(chunk)
        if size > MAX_IMAGE_BYTES:
            raise ValueError(f"{where}: the image is larger than {MAX_IMAGE_BYTES} bytes")
        if time.monotonic() > deadline:
            raise ValueError(f"{where}: fetching the image took longer than the timeout")
        chunks.append(chunk)
    return b"".join(chunks)
