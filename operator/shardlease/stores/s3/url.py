"""The S3 store's URL: `s3://BUCKET[/PREFIX]?endpoint=...`, parsed, checked
and shown without credentials."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

from shardlease.errors import ConfigError

URL_FORM = ("s3://BUCKET[/PREFIX][?endpoint=http://HOST:PORT&region=REGION"
            "&path_style=true|false]")
_QUERY_KEYS = ("endpoint", "region", "path_style")
_BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,254}$")
_USERINFO = re.compile(r"//[^/?#@\s]*@")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _clean_prefix(prefix: str) -> str:
    cleaned = prefix.strip("/")
    if cleaned and any(part in ("", ".", "..") for part in cleaned.split("/")):
        raise ConfigError(f"S3 prefix {prefix!r} has an empty, '.' or '..' part: use {URL_FORM}")
    return cleaned


def _clean_endpoint(endpoint: str) -> str:
    try:
        parts = urlsplit(endpoint)
        parts.port  # noqa: B018 - validates the port
    except ValueError as e:
        raise ConfigError(f"invalid S3 endpoint {_redacted(endpoint)!r} ({e}): "
                          f"use {URL_FORM}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"S3 endpoint {_redacted(endpoint)!r} must look like "
                          f"http(s)://HOST[:PORT]: use {URL_FORM}")
    if parts.username or parts.password:
        raise ConfigError("put no credentials in the S3 endpoint: they come from the AWS "
                          "environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE)")
    return endpoint.rstrip("/")


def _redacted(url: str) -> str:
    """`url` with the user info of it (and of any URL inside it) replaced by `***`."""
    return _USERINFO.sub("//***@", url)


def _public_url(url: str) -> str:
    """The URL without user info, query or fragment (nothing secret)."""
    try:
        parts = urlsplit(url)
        netloc = parts.hostname or ""
        if parts.port is not None:
            netloc = f"{netloc}:{parts.port}"
    except ValueError:
        return "(unparsable endpoint)"
    if ":" in (parts.hostname or "") and not netloc.startswith("["):
        netloc = f"[{parts.hostname}]" + (f":{parts.port}" if parts.port is not None else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
