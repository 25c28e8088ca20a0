"""Where `vllm-jax run-batch` reads its lines and writes its output, as vLLM's run-batch takes them: a local file,
stdin / stdout (`-`), or an http(s) URL. An input URL is fetched with a GET. An output URL gets the whole output
file in one PUT once the batch is done (vLLM's behaviour: an object store takes a file, not a stream of lines);
until then the lines are written, as they complete, to a staging file in `--output-tmp-dir` (default: the
system's temporary directory), which is deleted once uploaded and kept, with its path printed, when the upload
fails or the run stops early, so finished lines are never lost. A URL is printed without its query string: a
pre-signed URL carries its credentials there."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO
from urllib.parse import urlsplit, urlunsplit

import httpx

logger = logging.getLogger("vllm_jax.run_batch")

URL_PREFIXES = ("http://", "https://")
DOWNLOAD_TIMEOUT_S = 300.0
UPLOAD_TIMEOUT_S = 1000.0  # a large output over a slow link (vLLM allows as long)
UPLOAD_ATTEMPTS = 3
UPLOAD_RETRY_DELAY_S = 5.0


class UploadError(OSError):
    """The output could not be PUT to its URL; the message names the staging file that still holds it."""


def is_url(path: str) -> bool:
    return path.startswith(URL_PREFIXES)


def shown(path: str) -> str:
    """`path` as messages print it: a URL without its query string and fragment (where signatures live)."""
    if not is_url(path):
        return path
    parts = urlsplit(path)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")) + ("?…" if parts.query else "")


def _why(exc: httpx.HTTPError) -> str:
    """What went wrong, without the URL httpx puts in a status error's message."""
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code} {exc.response.reason_phrase}"
    return f"{type(exc).__name__}: {exc}"


def read_input_lines(path: str) -> list[str]:
    """The non-blank lines of a local file, of stdin (`-`) or of an http(s) URL's body; OSError when it cannot be
    read (a missing file, a refused connection, a status other than 2xx)."""
    if path == "-":
        text = sys.stdin.read()
    elif is_url(path):
        try:
            reply = httpx.get(path, follow_redirects=True, timeout=DOWNLOAD_TIMEOUT_S)
            reply.raise_for_status()
        except httpx.HTTPError as exc:
            raise OSError(f"GET failed ({_why(exc)})") from exc
        text = reply.content.decode("utf-8")
    else:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    return [t for t in text.splitlines() if t.strip()]


@contextmanager
def output_stream(path: str, tmp_dir: str | None = None) -> Iterator[IO[str]]:
    """A text stream for the output lines: stdout for `-`, the file itself for a local path (`tmp_dir` unused, as
    in vLLM), else a staging file in `tmp_dir` that is PUT to the URL when the block ends without an error."""
    if path == "-":
        yield sys.stdout
        return
    if not is_url(path):
        with open(path, "w", encoding="utf-8") as f:
            yield f
        return
    fd, staged = tempfile.mkstemp(prefix="tmp_batch_output_", suffix=".jsonl", dir=tmp_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
    except BaseException:
        if os.path.getsize(staged):
            print(f"run-batch: stopped before uploading to {shown(path)}; the lines written so far are in "
                  f"{staged}", file=sys.stderr)
        else:
            os.unlink(staged)
        raise
    upload(staged, path)
    os.unlink(staged)
    print(f"run-batch: output uploaded to {shown(path)}", file=sys.stderr)


def upload(staged: str, url: str) -> None:
    """PUT the staged file to `url`, trying UPLOAD_ATTEMPTS times; UploadError if every try fails. httpx sends a
    file's length (Content-Length), not a chunked body, which object stores refuse."""
    problem = ""
    for attempt in range(1, UPLOAD_ATTEMPTS + 1):
        try:
            with open(staged, "rb") as f:
                reply = httpx.put(url, content=f, timeout=UPLOAD_TIMEOUT_S,
                                  headers={"Content-Type": "application/jsonl"})
            reply.raise_for_status()
            return
        except httpx.HTTPError as exc:
            problem = _why(exc)
            if attempt < UPLOAD_ATTEMPTS:
                logger.warning("PUT %s failed (attempt %d of %d: %s); retrying in %.0f s", shown(url), attempt,
                               UPLOAD_ATTEMPTS, problem, UPLOAD_RETRY_DELAY_S)
                time.sleep(UPLOAD_RETRY_DELAY_S)
    raise UploadError(f"PUT failed {UPLOAD_ATTEMPTS} times ({problem}); the output is kept in {staged}")
