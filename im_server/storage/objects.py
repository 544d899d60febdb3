"""The object store (S3 API) behind attachments: one aiobotocore client per process.

Everything speaks SigV4 with path-style addressing (``<endpoint>/<bucket>/<key>``), which
SeaweedFS and MinIO need and AWS S3 and R2 accept. Presigned URLs handed to clients are
signed for ``s3_public_endpoint`` when it is set (the host is part of the signature, so
rewriting a URL afterwards would break it): a second client, which never opens a
connection, signs them.

A store that cannot be reached (refused connection, timeout, 5xx) raises
``ObjectStoreUnavailable``, a ``ConnectionError``, so ``errors.is_store_error`` answers it
with 503 ``unavailable`` like a PostgreSQL or Redis failure; any other refusal raises
``ObjectStoreError`` with the store's error code.
"""

from __future__ import annotations

import contextlib
import logging
from contextlib import AsyncExitStack
from dataclasses import dataclass
from types import TracebackType
from typing import Any
from urllib.parse import quote

from aiobotocore.session import get_session
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

from im_server.config import Settings

log = logging.getLogger("im_server.objects")

_MISSING = {"404", "NoSuchKey", "NotFound", "NoSuchBucket"}
_DELETE_BATCH = 1000  # DeleteObjects takes at most this many keys
# a browser PUTs and GETs presigned URLs from the web client's page, another origin; the
# URL's signature is the credential, so any origin may use it
CORS_RULES: list[dict[str, Any]] = [
    {
        "AllowedOrigins": ["*"],
        "AllowedMethods": ["PUT", "GET", "HEAD"],
        "AllowedHeaders": ["*"],
        "ExposeHeaders": ["ETag"],
        "MaxAgeSeconds": 3600,
    }
]


class ObjectStoreError(Exception):
    """The object store refused a request; ``code`` is its error code (``AccessDenied``…)."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


class ObjectStoreUnavailable(ObjectStoreError, ConnectionError):
    """The object store could not be reached or failed (5xx): try again later."""


class ObjectTooLarge(ObjectStoreError):
    """``get`` found an object bigger than the caller's ``max_bytes``."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    size: int
    content_type: str | None


def content_disposition(filename: str) -> str:
    """``attachment`` with the name twice (RFC 6266): a plain-ASCII fallback, and the exact
    name percent-encoded in UTF-8 for every browser made since 2012."""
    fallback = "".join(c if 32 <= ord(c) < 127 and c not in '"\\' else "_" for c in filename)
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(filename, safe='')}"


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def _translate(exc: Exception, what: str) -> ObjectStoreError:
    if isinstance(exc, ClientError):
        code, status = _code(exc), _status(exc)
        if status >= 500 or code in ("SlowDown", "ServiceUnavailable", "InternalError"):
            return ObjectStoreUnavailable(f"object store: {what}: {code} ({status})", code)
        return ObjectStoreError(f"object store: {what}: {code} ({status})", code)
    if isinstance(exc, (BotoConnectionError, HTTPClientError, OSError, TimeoutError)):
        return ObjectStoreUnavailable(f"object store: {what}: {exc}")
    return ObjectStoreUnavailable(f"object store: {what}: {type(exc).__name__}: {exc}")


@contextlib.contextmanager
def _errors(what: str) -> Any:
    try:
        yield
    except ObjectStoreError:
        raise
    except (BotoCoreError, ClientError, OSError, TimeoutError) as exc:
        raise _translate(exc, what) from exc


_READ_CHUNK = 256 * 1024


class ObjectStore:
    """One bucket of an S3-compatible store. ``await ObjectStore.open(settings)`` (or
    ``async with``) creates the client; ``close()`` releases its connections."""

    def __init__(self, settings: Settings) -> None:
        if not settings.s3_endpoint:
            raise ValueError("IM_S3_ENDPOINT is not set (and no embedded store was started)")
        self.bucket = settings.s3_bucket
        self.endpoint = settings.s3_endpoint
        self.public_endpoint = settings.s3_public_endpoint or settings.s3_endpoint
        secret = settings.s3_secret_key.get_secret_value() if settings.s3_secret_key else None
        self._client_args: dict[str, Any] = {
            "region_name": settings.s3_region,
            "aws_access_key_id": settings.s3_access_key,
            "aws_secret_access_key": secret,
        }
        self._config = Config(
            signature_version="s3v4",
            s3={"addressing_style": "path"},
            connect_timeout=settings.store_timeout_seconds,
            read_timeout=max(30.0, settings.store_timeout_seconds),
            retries={"max_attempts": 2, "mode": "standard"},
            # newer botocore adds CRC checksums to every PUT; not every store knows them
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        self._stack = AsyncExitStack()
        self._client: Any = None
        self._signer: Any = None

    @classmethod
    async def open(cls, settings: Settings) -> ObjectStore:
        store = cls(settings)
        await store.start()
        return store

    async def start(self) -> None:
        session = get_session()
        self._client = await self._stack.enter_async_context(
            session.create_client(
                "s3", endpoint_url=self.endpoint, config=self._config, **self._client_args
            )
        )
        if self.public_endpoint == self.endpoint:
            self._signer = self._client
        else:
            self._signer = await self._stack.enter_async_context(
                session.create_client(
                    "s3",
                    endpoint_url=self.public_endpoint,
                    config=self._config,
                    **self._client_args,
                )
            )

    async def close(self) -> None:
        await self._stack.aclose()
        self._client = self._signer = None

    async def __aenter__(self) -> ObjectStore:
        if self._client is None:
            await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def client(self) -> Any:
        if self._client is None:
            raise RuntimeError("ObjectStore used before start() or after close()")
        return self._client

    # ------------------------------------------------------------------ bucket

    async def ensure_bucket(self) -> None:
        """Create the bucket when missing (a bucket that exists is ours), and give it
        CORS rules when it has none."""
        if not await self._bucket_exists():
            await self._create_bucket()
        await self.ensure_cors()

    async def _bucket_exists(self) -> bool:
        with _errors("head bucket"):
            try:
                await self.client.head_bucket(Bucket=self.bucket)
            except ClientError as exc:
                if _code(exc) not in _MISSING:
                    raise
                return False
        return True

    async def _create_bucket(self) -> None:
        with _errors("create bucket"):
            try:
                await self.client.create_bucket(Bucket=self.bucket)
            except ClientError as exc:
                if _code(exc) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise

    async def ensure_cors(self) -> bool:
        """Give the bucket ``CORS_RULES`` when it has no CORS configuration, so browsers
        may PUT and GET presigned URLs from the web client's page. A configuration the
        bucket has is the operator's and stays. A store without bucket CORS, or that
        refuses us, is logged and left alone (SeaweedFS, for one, allows every origin
        when unconfigured). True when the bucket has a configuration."""
        try:
            await self.client.get_bucket_cors(Bucket=self.bucket)
            return True
        except ClientError as exc:
            if _code(exc) != "NoSuchCORSConfiguration":
                log.warning("object store: cannot read the bucket's CORS (%s): left as is", exc)
                return False
        except (BotoCoreError, OSError, TimeoutError) as exc:
            log.warning("object store: cannot read the bucket's CORS (%s): left as is", exc)
            return False
        try:
            await self.client.put_bucket_cors(
                Bucket=self.bucket, CORSConfiguration={"CORSRules": CORS_RULES}
            )
        except (BotoCoreError, ClientError, OSError, TimeoutError) as exc:
            log.warning(
                "object store: cannot set the bucket's CORS (%s): browsers may be refused "
                "unless the store allows their origin",
                exc,
            )
            return False
        return True

    # ------------------------------------------------------------------ presigned URLs

    async def presign_put(
        self, key: str, content_type: str, size: int, expires_s: int
    ) -> tuple[str, dict[str, str]]:
        """A URL for one PUT of exactly ``size`` bytes of ``content_type``, and the headers
        the client must send with it (both are part of the signature)."""
        params = {
            "Bucket": self.bucket,
            "Key": key,
            "ContentType": content_type,
            "ContentLength": size,
        }
        with _errors("presign put"):
            url = await self._signer.generate_presigned_url(
                "put_object", Params=params, ExpiresIn=expires_s
            )
        return str(url), {"Content-Type": content_type, "Content-Length": str(size)}

    async def presign_get(
        self,
        key: str,
        expires_s: int,
        filename: str | None = None,
        content_type: str | None = None,
    ) -> str:
        """A download URL; with ``filename`` the response says ``attachment`` with that
        name, with ``content_type`` it carries that type whatever was stored."""
        params: dict[str, str] = {"Bucket": self.bucket, "Key": key}
        if filename is not None:
            params["ResponseContentDisposition"] = content_disposition(filename)
        if content_type is not None:
            params["ResponseContentType"] = content_type
        with _errors("presign get"):
            url = await self._signer.generate_presigned_url(
                "get_object", Params=params, ExpiresIn=expires_s
            )
        return str(url)

    # ------------------------------------------------------------------ objects

    async def head(self, key: str) -> ObjectInfo | None:
        """Size and type of a stored object; None when there is none."""
        with _errors("head"):
            try:
                r = await self.client.head_object(Bucket=self.bucket, Key=key)
            except ClientError as exc:
                if _code(exc) in _MISSING:
                    return None
                raise
        return ObjectInfo(size=int(r["ContentLength"]), content_type=r.get("ContentType"))

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` (inclusive, as HTTP ranges count) of an object."""
        if start < 0 or end < start:
            raise ValueError(f"bad range {start}-{end}")
        with _errors("get range"):
            r = await self.client.get_object(
                Bucket=self.bucket, Key=key, Range=f"bytes={start}-{end}"
            )
            async with r["Body"] as body:
                return bytes(await body.read())

    async def get(self, key: str, max_bytes: int) -> bytes:
        """The whole object; ``ObjectTooLarge`` when it has more than ``max_bytes``
        (refused before reading, and again while reading should it have grown)."""
        with _errors("get"):
            r = await self.client.get_object(Bucket=self.bucket, Key=key)
            async with r["Body"] as body:
                size = int(r.get("ContentLength", 0))
                if size > max_bytes:
                    raise ObjectTooLarge(f"object {key!r} has {size} bytes (> {max_bytes})")
                # read() with a size answers what has arrived, maybe less: read to the end
                chunks: list[bytes] = []
                total = 0
                while chunk := await body.read(_READ_CHUNK):
                    total += len(chunk)
                    if total > max_bytes:
                        raise ObjectTooLarge(f"object {key!r} has more than {max_bytes} bytes")
                    chunks.append(chunk)
        return b"".join(chunks)

    async def copy(self, src: str, dst: str) -> ObjectInfo | None:
        """Copy an object inside the bucket, server-side; the copy's size and type, or
        None when ``src`` has no object. What the copy holds is what ``src`` held at that
        moment: a later write to ``src`` does not reach it."""
        with _errors("copy"):
            try:
                await self.client.copy_object(
                    Bucket=self.bucket, Key=dst, CopySource={"Bucket": self.bucket, "Key": src}
                )
            except ClientError as exc:
                if _code(exc) in _MISSING:
                    return None
                raise
        return await self.head(dst)

    async def put(self, key: str, data: bytes, content_type: str) -> None:
        with _errors("put"):
            await self.client.put_object(
                Bucket=self.bucket, Key=key, Body=data, ContentType=content_type
            )

    async def delete(self, keys: list[str]) -> None:
        """Delete these objects (in batches of 1000); keys with no object are fine."""
        for i in range(0, len(keys), _DELETE_BATCH):
            chunk = keys[i : i + _DELETE_BATCH]
            with _errors("delete"):
                r = await self.client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True},
                )
            failed = [e for e in r.get("Errors", []) if e.get("Code") not in _MISSING]
            if failed:
                first = failed[0]
                raise ObjectStoreError(
                    f"object store: delete: {len(failed)} keys refused, first "
                    f"{first.get('Key')!r}: {first.get('Code')}",
                    str(first.get("Code", "")),
                )
