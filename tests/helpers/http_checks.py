"""Readers for what a live server answers: OpenAI error bodies and the Prometheus exposition of /metrics."""

from __future__ import annotations

import re
import time
from typing import Any

import httpx

ERROR_FIELDS = {"message", "type", "param", "code"}


def error_body(body: Any) -> dict[str, Any]:
    """The `error` object of an OpenAI error body (an HTTP body or an SSE error event), after checking its shape."""
    assert isinstance(body, dict) and set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == ERROR_FIELDS, body
    assert isinstance(err["message"], str) and err["message"], body
    assert isinstance(err["type"], str) and err["type"], body
    return err


def openai_error(resp: httpx.Response, status: int | None = None) -> dict[str, Any]:
    """The `error` object of a 4xx/5xx response (that must have `status`, if given)."""
    if status is not None:
        assert resp.status_code == status, (resp.status_code, resp.text[:500])
    assert 400 <= resp.status_code < 600, (resp.status_code, resp.text[:500])
    return error_body(resp.json())


def metric(text: str, name: str, **labels: str) -> float:
    """One sample of a Prometheus exposition: 0 when the family is there without that sample (a labelled counter
    appears once it has a value), an AssertionError when the exposition has no such family at all."""
    for line in text.splitlines():
        m = re.match(r"^([^{\s]+)(?:\{(.*)\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(m.group(3))
    assert f"# TYPE {name} " in text, f"{name} is not in the exposition"
    return 0.0


def wait_idle_metrics(url: str, timeout: float = 20.0) -> str:
    """Poll /metrics until nothing runs, waits or holds KV blocks; return the last exposition either way."""
    deadline = time.monotonic() + timeout
    while True:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        busy = (metric(text, "vllm:num_requests_running") + metric(text, "vllm:num_requests_waiting")
                + metric(text, "vllm:kv_cache_usage_perc"))
        if busy == 0 or time.monotonic() > deadline:
            return text
        time.sleep(0.05)
