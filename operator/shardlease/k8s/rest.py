"""One raw JSON call to the API server, for the agent and the operator.

kubernetes_asyncio's typed models are skipped on purpose: they are slow to
deserialize and hide the server's error message, which is what a user needs.
"""

from __future__ import annotations

import json
from typing import Any


async def call(api: Any, method: str, path: str, body: Any = None,
               content_type: str = "application/json", request_timeout: float = 15.0,
               query: list[tuple[str, str]] | None = None) -> tuple[int, dict[str, Any]]:
    """(HTTP status, decoded JSON body); never raises for an HTTP status."""
    resp = await api.call_api(
        path, method, query_params=query or [],
        header_params={"Content-Type": content_type, "Accept": "application/json"},
        body=body, auth_settings=["BearerToken"], _preload_content=False,
        _request_timeout=request_timeout)
    if isinstance(resp, tuple):
        resp = resp[0]
    try:
        data = await resp.read()
    finally:
        resp.release()
    try:
        payload = json.loads(data) if data else {}
    except ValueError:
        payload = {"message": data[:300].decode(errors="replace")}
    return int(resp.status), payload
