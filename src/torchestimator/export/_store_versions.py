"""Export versions in an object store (s3://, gs://, az://, memory://): publish, list, fetch to a local cache.

A store has no atomic rename, but it applies each PUT whole. So a version is built in a local temporary
folder as on a local disk, then every file is uploaded and the version's ``metadata.json`` last: it carries
the size and sha256 of every other file (``files``). A version prefix without metadata.json is an upload
in progress (or a killed one) and is not a version; one whose files do not match it is damaged. Listing
skips the first kind; ``fetch_version`` refuses the second, naming the URL and the file.

Loading copies a version to ``<cache root>/exports/<sha256 of the base URL, 16 hex>/<version>/``, verifies
every file against metadata.json while downloading, and renames the folder into place only when all match:
a folder in the cache is a verified copy, reused while the store's metadata.json is byte for byte the
one it was copied with. The cache root is ``$TORCHESTIMATOR_CACHE``, else ``$XDG_CACHE_HOME/torchestimator``,
else ``~/.cache/torchestimator``.

Deleting a version (exporters' garbage collection) removes metadata.json first, so a deletion cut short
leaves an incomplete prefix, never a listed version with files missing.

Does not belong here: building a version (saved_model.py), which versions to serve (serving/manager.py),
local version folders (versions.py: local paths never come here, and fsspec is never used for them).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from torchestimator._io import filesystems
from torchestimator.errors import ExportFormatError

__all__ = [
    "FILES_KEY",
    "cache_folder",
    "cache_root",
    "fetch_version",
    "file_records",
    "forget_cached",
    "has_metadata",
    "list_store_versions",
    "publish_version",
    "remove_version",
    "version_fingerprint",
]

logger = logging.getLogger(__name__)

METADATA_FILE = "metadata.json"  # saved_model.METADATA_FILE: not imported, so loading never imports the tracer
FILES_KEY = "files"
"""metadata.json's entry: {relative path: {"size": bytes, "sha256": hex}} of every other file of the version."""
CHUNK_BYTES = 8 * 2**20
PART_BYTES = 64 * 2**20
"""One part of a multipart upload (as the checkpoint store's ObjectStorage)."""
STALE_UPLOAD_SECONDS = 3600
"""An incomplete version prefix numbered (by its upload's start time) this long ago is a killed upload."""
_VERSION_ATTEMPTS = 10


# ------------------------------------------------------------------------------------------- checksums


def file_records(folder: str) -> dict[str, dict[str, Any]]:
    """Size and sha256 of every file under a local version folder but metadata.json, by '/'-joined path."""
    records = {}
    for root, folders, names in os.walk(folder):
        folders.sort()
        for name in sorted(names):
            path = os.path.join(root, name)
            relative = os.path.relpath(path, folder).replace(os.sep, "/")
            if relative == METADATA_FILE:
                continue
            digest, size = hashlib.sha256(), 0
            with open(path, "rb") as handle:
                for chunk in iter(lambda: handle.read(CHUNK_BYTES), b""):
                    digest.update(chunk)
                    size += len(chunk)
            records[relative] = {"size": size, "sha256": digest.hexdigest()}
    return records


def _checked_records(metadata_bytes: bytes, url: str) -> dict[str, dict[str, Any]]:
    """metadata.json's ``files``, each path relative and inside the version; ExportFormatError naming it else."""
    try:
        metadata = json.loads(metadata_bytes)
    except ValueError as error:
        raise ExportFormatError(f"{url} is not valid JSON ({error}); the version is damaged: re-export it.") from None
    records = metadata.get(FILES_KEY) if isinstance(metadata, dict) else None
    if not isinstance(records, dict) or not records:
        raise ExportFormatError(
            f"{url} lists no '{FILES_KEY}' (the size and sha256 of each file of the version), so its files cannot "
            "be checked: a version in an object store must be written by export_saved_model (or copied from a "
            "local export made by this torchestimator, whose metadata.json lists them)."
        )
    for relative, record in records.items():
        parts = relative.split("/") if isinstance(relative, str) else []
        if (
            not parts
            or any(part in ("", ".", "..") for part in parts)
            or "\\" in relative
            or relative == METADATA_FILE
            or not isinstance(record, dict)
            or not isinstance(record.get("size"), int)
            or not isinstance(record.get("sha256"), str)
        ):
            raise ExportFormatError(
                f"{url}: '{FILES_KEY}' entry {str(relative)[:80]!r} is not a relative path "
                "inside the version with an int size and a sha256; the version is damaged."
            )
    return records


# ------------------------------------------------------------------------------------------- publishing


def publish_version(
    folder: str, base_url: str, *, clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep
) -> str:
    """Uploads a finished local version folder to ``base_url/<int(clock())>``, metadata.json last; its URL.

    The number is taken when the local version is complete; a number with any object under it (a version,
    or someone's upload in progress) is never reused: wait a second and take the next. An upload that
    fails removes what it put (without metadata.json it was never a version anyway).
    """
    base_url = base_url.rstrip("/")
    if not os.path.isfile(os.path.join(folder, METADATA_FILE)):
        raise AssertionError(f"{folder} has no {METADATA_FILE}: build the version before publishing it")
    for _ in range(_VERSION_ATTEMPTS):
        name = str(int(clock()))
        if name not in _all_prefixes(base_url):
            break
        sleep(1)
    else:
        raise RuntimeError(
            f"Failed to obtain a unique export version under {base_url} after {_VERSION_ATTEMPTS} "
            "attempts; another process is exporting to the same base every second."
        )
    url = f"{base_url}/{name}"
    try:
        for relative in sorted(file_records(folder)):
            _upload(os.path.join(folder, *relative.split("/")), f"{url}/{relative}")
        with open(os.path.join(folder, METADATA_FILE), "rb") as handle:
            filesystems.write_bytes(f"{url}/{METADATA_FILE}", handle.read())  # one PUT: the version appears
    except BaseException:
        try:
            filesystems.remove_tree(url)
        except OSError as error:
            logger.warning(
                "Could not remove the incomplete upload %s (it is not a version: it has no %s): %s",
                url,
                METADATA_FILE,
                error,
            )
        raise
    return url


def _upload(local: str, url: str) -> None:
    """One file, streamed (a multipart upload for a big one, aborted if it fails: never half an object)."""
    fs, inner = filesystems.filesystem(url)
    handle = filesystems._store_call(url, "writing", fs.open, inner, "wb", block_size=PART_BYTES)
    try:
        with open(local, "rb") as source:
            for chunk in iter(lambda: source.read(CHUNK_BYTES), b""):
                handle.write(chunk)
    except BaseException:
        discard = getattr(handle, "discard", None)
        if discard is not None:
            discard()
        raise
    filesystems._store_call(url, "writing", handle.close)


# ------------------------------------------------------------------------------------------- listing


def _objects(base_url: str) -> dict[str, dict[str, Any]]:
    """Every object under the base (one flat listing, paged by the store), keyed by its path below the base."""
    fs, inner = filesystems.filesystem(base_url)
    inner = inner.rstrip("/")
    fs.invalidate_cache(inner)
    try:
        found = fs.find(inner, withdirs=False, detail=True)
    except FileNotFoundError:
        return {}
    except Exception as error:  # unreachable store, no credentials: the caller decides what to do
        raise filesystems._named(error, base_url, "listing") from error
    prefix = inner + "/"
    return {name[len(prefix) :]: info for name, info in found.items() if name.startswith(prefix)}


def _by_version(objects: Mapping[str, dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    versions: dict[str, dict[str, dict[str, Any]]] = {}
    for relative, info in objects.items():
        first, _, rest = relative.partition("/")
        if rest and first.isascii() and first.isdigit():
            versions.setdefault(first, {})[rest] = info
    return versions


def _all_prefixes(base_url: str) -> set[str]:
    return set(_by_version(_objects(base_url)))


def list_store_versions(base_url: str, *, complete: bool = True) -> dict[int, str]:
    """{version: its name under the base} of the version prefixes holding metadata.json (``complete``), or of
    those that do not (``complete=False``: uploads in progress or killed). An absent base has none."""
    found = {}
    for name, files in _by_version(_objects(base_url.rstrip("/"))).items():
        if (METADATA_FILE in files) == complete:
            found[int(name)] = name
    return found


def version_fingerprint(url: str) -> tuple[Any, ...]:
    """Names, sizes and ETags (or modification times) of a version's objects: a failed version is retried
    when they change."""
    entries = []
    for relative, info in _objects(url.rstrip("/")).items():
        stamp = next(
            (
                info[key]
                for key in ("ETag", "etag", "md5Hash", "LastModified", "updated", "mtime", "created")
                if info.get(key) is not None
            ),
            None,
        )
        entries.append((relative, info.get("size"), str(stamp)))
    return tuple(sorted(entries))


def has_metadata(url: str) -> bool:
    """Whether ``url`` is a complete version: its metadata.json is there (read, not looked up in a cache)."""
    fs, inner = filesystems.filesystem(f"{url.rstrip('/')}/{METADATA_FILE}")
    fs.invalidate_cache(inner)
    try:
        return bool(filesystems._store_call(url, "looking for", fs.isfile, inner))
    except FileNotFoundError:
        return False


def remove_version(url: str) -> None:
    """Deletes a version, metadata.json first: cut short, it leaves an incomplete prefix, never a listed
    version with files missing."""
    filesystems.remove(f"{url.rstrip('/')}/{METADATA_FILE}")
    filesystems.remove_tree(url)


# ------------------------------------------------------------------------------------------- the local cache


def cache_root() -> str:
    """``$TORCHESTIMATOR_CACHE``, else ``$XDG_CACHE_HOME/torchestimator``, else ``~/.cache/torchestimator``."""
    configured = os.environ.get("TORCHESTIMATOR_CACHE")
    if configured:
        return configured
    xdg = os.environ.get("XDG_CACHE_HOME")
    return os.path.join(xdg or os.path.join(os.path.expanduser("~"), ".cache"), "torchestimator")


def cache_folder(url: str, root: str | None = None) -> str:
    """Where the local copy of the version at ``url`` lives: ``<root>/exports/<hash of its base URL>/<version>``."""
    base, name = posixpath.split(url.rstrip("/"))
    digest = hashlib.sha256(base.encode("utf-8")).hexdigest()[:16]
    return os.path.join(cache_root() if root is None else root, "exports", digest, name)


def fetch_version(url: str, *, root: str | None = None) -> str:
    """A verified local copy of the version at ``url`` (reused when already cached); its path.

    Raises:
        ExportFormatError: the version has no metadata.json (incomplete: still uploading, or not a version),
            lists no checksums, or a file is missing or does not match them (named with the URL).
        OSError: the store could not be reached or read (naming the URL), or the cache could not be written.
    """
    url = url.rstrip("/")
    metadata_url = f"{url}/{METADATA_FILE}"
    try:
        metadata_bytes = filesystems.read_bytes(metadata_url)
    except FileNotFoundError:
        raise ExportFormatError(
            f"{url} is not a complete export version: it has no {METADATA_FILE}, which export_saved_model uploads "
            "after every other file (an upload in progress, or one that was cut short)."
        ) from None
    records = _checked_records(metadata_bytes, metadata_url)
    target = cache_folder(url, root)
    if _cached_copy_matches(target, metadata_bytes, records):
        logger.debug("Reusing the verified copy %s of %s.", target, url)
        return target
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".tmp-{os.path.basename(target)}-", dir=parent)
    try:
        fs, inner = filesystems.filesystem(url)
        fs.invalidate_cache(inner)  # sizes a listing cached before the version was complete
        for relative, record in sorted(records.items()):
            _download_verified(f"{url}/{relative}", os.path.join(staging, *relative.split("/")), record)
        with open(os.path.join(staging, METADATA_FILE), "wb") as handle:
            handle.write(metadata_bytes)
        _move_into_place(staging, target, metadata_bytes, records)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("Copied %s to %s (%d files verified).", url, target, len(records))
    return target


def _download_verified(url: str, local: str, record: Mapping[str, Any]) -> None:
    fs, inner = filesystems.filesystem(url)
    os.makedirs(os.path.dirname(local), exist_ok=True)
    digest, size = hashlib.sha256(), 0
    try:
        source = fs.open(inner, "rb", block_size=CHUNK_BYTES)
    except FileNotFoundError:
        raise ExportFormatError(
            f"{url} is missing, though the version's {METADATA_FILE} lists it: the version is damaged; re-export it."
        ) from None
    except Exception as error:
        raise filesystems._named(error, url, "opening") from error
    try:
        with source, open(local, "wb") as target:
            for chunk in _chunks(source, url):
                digest.update(chunk)
                size += len(chunk)
                if size > record["size"]:
                    break
                target.write(chunk)
    except FileNotFoundError:  # deleted between listing and reading
        raise ExportFormatError(
            f"{url} is missing, though the version's {METADATA_FILE} lists it: the version is damaged; re-export it."
        ) from None
    if size != record["size"] or digest.hexdigest() != record["sha256"]:
        what = (
            f"{size if size <= record['size'] else 'more than ' + str(record['size'])} bytes where "
            f"{METADATA_FILE} says {record['size']}"
            if size != record["size"]
            else f"sha256 {digest.hexdigest()[:16]}... where {METADATA_FILE} says {record['sha256'][:16]}..."
        )
        raise ExportFormatError(
            f"{url} does not match the version's {METADATA_FILE} ({what}): the version is "
            "damaged and is not loaded; re-export it."
        )


def _chunks(source: Any, url: str) -> Iterator[bytes]:
    while True:
        try:
            chunk = source.read(CHUNK_BYTES)
        except FileNotFoundError:
            raise
        except Exception as error:
            raise filesystems._named(error, url, "reading") from error
        if not chunk:
            return
        yield chunk


def _cached_copy_matches(folder: str, metadata_bytes: bytes, records: Mapping[str, Mapping[str, Any]]) -> bool:
    """A folder in the cache was verified before it was renamed there; it is reused while the store's
    metadata.json is the one it was copied with and no file changed size since."""
    try:
        with open(os.path.join(folder, METADATA_FILE), "rb") as handle:
            if handle.read() != metadata_bytes:
                return False
        return all(
            os.path.getsize(os.path.join(folder, *relative.split("/"))) == record["size"]
            for relative, record in records.items()
        )
    except OSError:
        return False


def _move_into_place(
    staging: str, target: str, metadata_bytes: bytes, records: Mapping[str, Mapping[str, Any]]
) -> None:
    """Renames the verified copy into place; a stale copy there (another metadata) is moved aside first, and a
    matching one that another process placed meanwhile is kept."""
    for _ in range(3):
        try:
            os.rename(staging, target)
            return
        except OSError:
            if not os.path.exists(target):
                raise
        if _cached_copy_matches(target, metadata_bytes, records):
            return  # another process copied the same version first
        aside = f"{target}.old-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(target, aside)
        except FileNotFoundError:
            continue
        shutil.rmtree(aside, ignore_errors=True)
    raise OSError(f"could not place the copy of an export version at {target}: it keeps being replaced")


def forget_cached(url: str, root: str | None = None) -> None:
    """Removes the local copy of a version (a server's, once it no longer serves the version)."""
    folder = cache_folder(url, root)
    if not os.path.isdir(folder):
        return
    aside = f"{folder}.old-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(folder, aside)
    except OSError:
        return
    shutil.rmtree(aside, ignore_errors=True)
