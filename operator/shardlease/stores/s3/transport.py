"""The S3 store's transport: the aiobotocore session and its hooks, what
its errors mean (`guarded`: every failure of a call as one `_S3Failure`
whose message names the operation, the object and the endpoint), bounded
reads, request kinds."""

from __future__ import annotations

import asyncio
import collections.abc
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from aiobotocore.session import get_session  # type: ignore[import-untyped]
from botocore.exceptions import (  # type: ignore[import-untyped]
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)
from botocore.handlers import (  # type: ignore[import-untyped]
    _handle_200_error,
)

from shardlease.errors import StoreError

T = TypeVar("T")

#: The request kind each S3 operation is reported as (`stores.requests`).
_KINDS = {
    "ListObjectsV2": "list",
    "GetObject": "get",
    "HeadObject": "get",
    "PutObject": "put",
    "DeleteObject": "delete",
}

_SAFE_STORES = ("AWS S3, a MinIO release with conditional PUTs, Ceph RGW, "
                "Cloudflare R2, Google Cloud Storage's XML API, ...")


class _S3Failure(StoreError):
    """A request S3 answered with an error (or that never got an answer)."""

    def __init__(self, message: str, code: str = "", status: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


@dataclass(frozen=True, slots=True)
class Where:
    """What a failed call's message names: the S3 operation, the object's
    URL (no secrets), the endpoint, and the bucket."""

    operation: str
    url: str
    endpoint: str
    bucket: str


async def guarded(call: Callable[[], Awaitable[T]], deadline: float, where: Where) -> T:
    """`call()` within `deadline` seconds; every way it can fail (no answer,
    a refusal, no route, no credentials) raised as one `_S3Failure` whose
    message says what to check."""
    op, url, endpoint = where.operation, where.url, where.endpoint
    try:
        async with asyncio.timeout(deadline):
            return await call()
    except TimeoutError:
        raise _S3Failure(
            f"the S3 endpoint {endpoint} did not answer {op} {url} within {deadline:g} s"
        ) from None
    except ClientError as e:
        raise refusal(e, where) from None
    except (EndpointConnectionError, ConnectTimeoutError) as e:
        raise _S3Failure(f"cannot reach the S3 endpoint {endpoint} ({op} {url}): {e}") from None
    except NoCredentialsError:
        raise _S3Failure(
            f"no AWS credentials for the S3 endpoint {endpoint}: set "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or a role") from None
    except ReadTimeoutError as e:
        raise _S3Failure(
            f"the S3 endpoint {endpoint} did not answer in time ({op} {url}): {e}") from None
    except (BotoCoreError, OSError) as e:
        raise _S3Failure(
            f"S3 {op} {url} at {endpoint} failed: {type(e).__name__}: {e}") from None


def refusal(e: ClientError, where: Where) -> _S3Failure:
    """What an S3 error answer means, as a `_S3Failure` (its code and HTTP
    status kept for the callers that tell a lost race from a failure)."""
    error: Mapping[str, Any] = e.response.get("Error", {})
    status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    code = str(error.get("Code") or status)
    message = str(error.get("Message") or "")
    endpoint = where.endpoint
    at = f"{where.operation} {where.url} at {endpoint}"
    headers: Mapping[str, Any] = e.response.get("ResponseMetadata", {}).get(
        "HTTPHeaders", {}) or {}
    not_s3 = headers.get(_NOT_S3)
    if not_s3:
        return _S3Failure(
            f"the endpoint {endpoint} does not look like S3: it answered "
            f"{where.operation} {where.url} with HTTP 200 and {not_s3}, not an S3 "
            "response; check the endpoint URL",
            code="NotS3", status=200)
    if code == "NoSuchBucket":
        text = (f"the bucket {where.bucket!r} does not exist at the S3 endpoint "
                f"{endpoint} ({at}): create it first")
    elif code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                  "ExpiredToken", "InvalidToken"):
        text = (f"S3 refused {at}: {code} (HTTP {status}): {message}; "
                "check the credentials and the bucket policy")
    else:
        text = f"S3 {at} failed: {code} (HTTP {status}){': ' if message else ''}{message}"
    return _S3Failure(text, code=code, status=status)


#: botocore's data loader (service models, endpoint rules), shared by the
#: sessions of every store: loading them is most of the cost of a new client.
_loader: Any = None


def _session() -> Any:
    """A new aiobotocore session (its own credentials), with the shared loader."""
    global _loader
    session = get_session()
    if _loader is None:
        _loader = session.get_component("data_loader")
    else:
        session.register_component("data_loader", _loader)
    return session


#: A response header set on a 200 whose body is not S3's XML (see `_mark_not_s3`).
_NOT_S3 = "x-shardlease-not-s3"


def _mark_not_s3(response_dict: dict[str, Any] | None = None, **kwargs: Any) -> None:
    """Note a 200 answer whose body is not XML before botocore rewrites its status.

    botocore reads a 200 with an unparsable body as an S3 error embedded in a
    success (CopyObject does that) and turns it into a 500, so an endpoint
    that is not S3 at all (a web page, a JSON API) would be reported as
    "HTTP 500" although it answered 200. The note travels in the response's
    headers, which the error keeps."""
    try:
        _note_not_s3(response_dict)
    finally:
        _handle_200_error(response_dict=response_dict, **kwargs)


def _note_not_s3(response_dict: dict[str, Any] | None) -> None:
    if not response_dict or response_dict.get("status_code") != 200:
        return
    body = response_dict.get("body")
    if not isinstance(body, bytes | bytearray) or not body:
        return  # a streamed object body (GetObject), or none (PutObject)
    head = bytes(body[:512]).lstrip().lower()
    if head.startswith(b"<") and b"<html" not in head and b"<!doctype html" not in head:
        return  # XML: S3's own (an error embedded in a 200 stays botocore's business)
    headers = response_dict.get("headers")
    if isinstance(headers, collections.abc.MutableMapping):
        kind = str(headers.get("content-type") or "no content type")
        preview = bytes(body[:60]).decode("utf-8", "replace")
        headers[_NOT_S3] = f"a body of {kind}: {preview!r}"
        # An HTML page parses as XML: without this it would read as "no objects".
        response_dict["status_code"] = 500


def _total_size(content_range: str | None, content_length: int | None, read: int) -> int:
    """The object's size: from `bytes 0-4096/10000` when S3 honoured the Range,
    else the length of the whole body."""
    if content_range and "/" in content_range:
        total = content_range.rsplit("/", 1)[1].strip()
        if total.isdigit():
            return int(total)
    if content_length is not None:
        return max(int(content_length), read)
    return read


async def read_at_most(body: Any, limit: int) -> bytes:
    """At most `limit` bytes of a streaming body: records are bounded before parsing."""
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = await body.read(limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


async def _all(calls: list[Coroutine[Any, Any, T]]) -> list[T]:
    """Run the calls concurrently; on the first failure cancel the rest and raise it."""
    tasks: list[asyncio.Task[T]] = []
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(call) for call in calls]
    except BaseExceptionGroup as failed:
        first = failed.exceptions[0]
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None
    return [task.result() for task in tasks]
