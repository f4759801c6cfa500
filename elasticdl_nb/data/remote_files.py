"""Object-store URLs (s3://, gs://, any fsspec protocol) as input data.

Only this module talks to fsspec. It tells a remote URL from a local path,
expands globs, gives sizes, versions and ranged reads, and turns whatever the store
raises (no such bucket or object, refused credentials, unknown protocol) into
a DataError that says what to fix, so such problems surface when the SDK
resolves the sources, before anything is launched. Credentials and endpoints
are never passed here: each store's library reads them from the environment
(for S3, botocore: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from elasticdl_nb.data.errors import DataError

_GLOB_CHARACTERS = frozenset("*?[")
_LOCAL_PROTOCOLS = frozenset({"file", "local"})


def is_remote(path: str | os.PathLike) -> bool:
    """True for a URL with a protocol other than file:// (which stays a local path)."""
    protocol, separator, _ = os.fspath(path).partition("://")
    return bool(separator) and protocol.lower() not in _LOCAL_PROTOCOLS


class ObjectStore:
    """One fsspec filesystem (one session, one set of credentials) for one protocol's URLs.

    Made anew for each resolution and each reader rather than taken from fsspec's
    instance cache: a notebook that fixes its credentials or uploads more files and
    tries again must not get the old session or the old listing.
    """

    def __init__(self, url: str) -> None:
        import fsspec

        try:
            self._fs, _ = fsspec.core.url_to_fs(url, skip_instance_cache=True)
        except (ImportError, ValueError) as error:
            protocol = url.partition("://")[0]
            raise DataError(
                f"Cannot open {url!r}: fsspec has no usable driver for the {protocol!r} "
                f"protocol ({error}). Fix: install the fsspec driver for it (s3fs for "
                f"s3://, gcsfs for gs://, adlfs for az://) where the job runs, or copy "
                f"the data to a local or mounted path."
            ) from error

    def expand(self, pattern: str) -> list[str]:
        """Full URLs of the files `pattern` names (sorted glob matches, or the one file).

        Raises DataError if nothing matches, the bucket does not exist, the store
        refuses the credentials, or a non-glob URL names a directory.
        """
        path = self._fs._strip_protocol(pattern)
        is_glob = any(character in _GLOB_CHARACTERS for character in path)
        try:
            if is_glob:
                found = self._fs.glob(path, detail=True)
                files = sorted(p for p, info in found.items() if info.get("type") != "directory")
            else:
                info = self._fs.info(path)
                if info.get("type") == "directory":
                    raise DataError(
                        f"Input {pattern!r} is a directory (a prefix) in the object store, "
                        f"not a file. Fix: pass a glob for the files under it, such as "
                        f"'{pattern.rstrip('/')}/*.csv'."
                    )
                files = [path]
        except DataError:
            raise
        except FileNotFoundError:
            files = []
        except Exception as error:  # noqa: BLE001 - every store error becomes a DataError
            raise access_error(pattern, error) from error
        if not files:
            raise self._nothing_found(pattern, path, is_glob)
        return [self._fs.unstrip_protocol(p) for p in files]

    def stat(self, url: str) -> tuple[int, str]:
        """(size in bytes, version tag) of the object at `url`; the tag is the store's
        ETag (or modification time), "" if it has neither."""
        try:
            info = self._fs.info(self._fs._strip_protocol(url))
        except Exception as error:  # noqa: BLE001
            raise access_error(url, error) from error
        tag = info.get("ETag") or info.get("etag") or info.get("mtime") or ""
        return int(info["size"]), str(tag)

    def stream(self, url: str, size: int, chunk_bytes: int) -> Iterator[bytes]:
        """The object's `size` bytes in order, one request of `chunk_bytes` at a time."""
        for start in range(0, size, chunk_bytes):
            yield self.read(url, start, min(start + chunk_bytes, size))

    def read(self, url: str, start: int, stop: int) -> bytes:
        """Bytes [start, stop) of the object (one ranged request)."""
        if stop <= start:
            return b""
        try:
            return self._fs.cat_file(self._fs._strip_protocol(url), start=start, end=stop)
        except Exception as error:  # noqa: BLE001
            raise access_error(url, error) from error

    def _nothing_found(self, pattern: str, path: str, is_glob: bool) -> DataError:
        bucket = path.split("/", 1)[0]
        try:
            bucket_exists = bool(self._fs.exists(bucket))
        except Exception as error:  # noqa: BLE001
            return access_error(pattern, error)
        if not bucket_exists:
            return DataError(
                f"No input data found for {pattern!r}: the bucket {bucket!r} does not "
                f"exist (or is not visible with these credentials). Fix: check the bucket "
                f"name, and for an S3-compatible server that AWS_ENDPOINT_URL points at it."
            )
        what = "no object matches this glob" if is_glob else "this object does not exist"
        return DataError(
            f"No input data found for {pattern!r}: {what} in bucket {bucket!r}. Fix: check "
            f"the key or glob (globs match whole keys: 'part-*.csv' does not descend into "
            f"folders, '**/*.csv' does)."
        )


def access_error(url: str, error: BaseException) -> DataError:
    """The DataError for a store operation on `url` that raised `error`."""
    detail = f"{type(error).__name__}: {error}"
    if isinstance(error, FileNotFoundError):
        cause = "the object (or its bucket) does not exist"
        fix = "check the bucket and key, e.g. by listing them with the store's own tool"
    elif isinstance(error, PermissionError) or "credential" in detail.lower():
        cause = "the store refused the credentials (missing, wrong, or not allowed to read)"
        fix = (
            "set valid credentials in the environment of the notebook and of the job "
            "(for S3: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, plus AWS_SESSION_TOKEN "
            "for temporary ones, or AWS_PROFILE), with read access to the objects; an "
            "S3-compatible server also needs AWS_ENDPOINT_URL"
        )
    else:
        cause = "the store could not be reached or answered with an error"
        fix = (
            "check the URL and that the store is reachable from here (for an "
            "S3-compatible server set AWS_ENDPOINT_URL, e.g. http://minio:9000)"
        )
    return DataError(f"Cannot read input {url!r}: {cause} ({detail}). Fix: {fix}.")
