"""Pure builders of TensorStore specs (dicts); tests compare them as dicts.

Why zarr3, chunks that tile each saved shard, crc32c codec (see docs/checkpoint.md for the measurements):

* chunks inside one shard (one per shard, or several of <= 16 MiB) mean every process writes whole
  chunks it alone owns: no read-modify-write,
  no cross-process locking, and the chunk files can be written in parallel from every host;
* the ``crc32c`` codec appends a checksum to every chunk, so a flipped or truncated chunk fails its
  read with an error instead of returning garbage; ``fill_missing_data_reads=False`` turns a missing
  chunk into an error as well (zarr would silently read the fill value);
* every chunk is stored even when it equals the fill value, so "missing" always means damage;
* no compression: checkpoint tensors (weights, optimizer moments) barely compress and the CPU time
  would sit on the save path.
"""

from __future__ import annotations

import math
import os
import posixpath
from collections.abc import Mapping, Sequence
from typing import Any

from ..env import Env
from .layout import Location

# zarr3 ``data_type`` names (TensorStore's) for numpy / ml_dtypes dtype names: stored as themselves.
_ZARR_DTYPES = {name: name for name in (
    "bool", "int2", "int4", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float4_e2m1fn", "float8_e3m4", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e4m3b11fnuz", "float8_e5m2",
    "float8_e5m2fnuz", "float8_e8m0fnu", "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
)}
# ml_dtypes types that TensorStore's zarr3 has no name for: stored as their raw bytes, an unsigned integer of
# the same item size (``reprieve.json`` records the real dtype; restore views the bytes back bit-exactly).
_RAW_DTYPES = {"uint1": "uint8", "uint2": "uint8", "uint4": "uint8", "int1": "uint8", "float8_e4m3": "uint8",
               "float6_e2m3fn": "uint8", "float6_e3m2fn": "uint8"}


def zarr_dtype(dtype_name: str) -> str:
    """The zarr3 data type an array of ``dtype_name`` is stored as (itself, or its raw bytes' integer type).

    Raises:
        TypeError: the dtype cannot be stored (object, string, structured, datetime...).
    """
    if dtype_name in _ZARR_DTYPES:
        return _ZARR_DTYPES[dtype_name]
    if dtype_name in _RAW_DTYPES:
        return _RAW_DTYPES[dtype_name]
    raise TypeError(
        f"dtype {dtype_name!r} is not supported; expected one of "
        f"{sorted(_ZARR_DTYPES) + sorted(_RAW_DTYPES)}"
    )


def stored_as(dtype_name: str) -> str | None:
    """The integer dtype whose bytes hold ``dtype_name`` on disk, or None when zarr3 stores it by name."""
    zarr_dtype(dtype_name)
    return _RAW_DTYPES.get(dtype_name)


def fill_value(zarr_name: str) -> Any:
    """zarr3 fill value of the data type: complex ones are ``[real, imag]``, booleans ``false``."""
    if zarr_name.startswith("complex"):
        return [0.0, 0.0]
    return False if zarr_name == "bool" else 0


def kvstore_spec(loc: Location, subpath: str = "", env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The kvstore spec for ``subpath`` (a directory, '' for the root) under ``loc``.

    S3 endpoint and region come from ``REPRIEVE_S3_ENDPOINT`` / ``AWS_ENDPOINT_URL_S3`` /
    ``AWS_ENDPOINT_URL`` and ``AWS_REGION`` / ``AWS_DEFAULT_REGION`` (for S3-compatible stores and
    emulators); GCS endpoints are moved with TensorStore's own ``TENSORSTORE_GCS_HTTP_URL``.
    """
    env = os.environ if env is None else env
    sub = subpath.strip("/")
    if loc.scheme == "file":
        path = posixpath.join(loc.path, sub) if sub else loc.path
        return {"driver": "file", "path": path.rstrip("/") + "/"}
    prefix = loc.path + (sub + "/" if sub else "")
    if loc.scheme == "gs":
        return {"driver": "gcs", "bucket": loc.bucket, "path": prefix}
    if loc.scheme == "s3":
        spec: dict[str, Any] = {"driver": "s3", "bucket": loc.bucket, "path": prefix}
        endpoint = (Env(env).opt_text("REPRIEVE_S3_ENDPOINT") or env.get("AWS_ENDPOINT_URL_S3")
                    or env.get("AWS_ENDPOINT_URL"))
        if endpoint:
            spec["endpoint"] = endpoint
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        if region:
            spec["aws_region"] = region
        elif endpoint:
            spec["aws_region"] = "us-east-1"
        return spec
    raise ValueError(f"checkpoint location {loc.uri()!r}: unsupported scheme {loc.scheme!r}")


def chunk_shape_for(shape: Sequence[int], shard_shape: Sequence[int], *, itemsize: int = 1,
                    max_chunk_bytes: int | None = None) -> list[int]:
    """zarr3 chunk shape: the shard shape (chunks must be >= 1 even for empty dimensions), split along its
    leading dimensions into equal parts of at most ``max_chunk_bytes`` where it can be.

    Parts divide the shard exactly, so every chunk still lies inside one shard and is written by the one
    process that owns it. A dimension whose size has no divisor small enough is split as far as it goes and
    the next dimension is split too; a chunk can stay above the cap only when a single row of the last
    dimension is bigger.
    """
    if len(shape) != len(shard_shape):
        raise ValueError(f"shard shape {tuple(shard_shape)} has a different rank than array shape {tuple(shape)}")
    chunk = [max(1, int(s)) for s in shard_shape]
    if not max_chunk_bytes:
        return chunk
    for k in range(len(chunk)):
        nbytes = math.prod(chunk) * itemsize
        if nbytes <= max_chunk_bytes:
            break
        per_unit = nbytes // chunk[k]  # bytes of one index along dimension k
        fits = max(1, max_chunk_bytes // per_unit)
        chunk[k] = max(d for d in _divisors(chunk[k]) if d <= fits)
    return chunk


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small)]


def zarr3_metadata(shape: Sequence[int], dtype_name: str, chunk_shape: Sequence[int]) -> dict[str, Any]:
    zdt = zarr_dtype(dtype_name)
    return {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [int(s) for s in shape],
        "data_type": zdt,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [int(c) for c in chunk_shape]}},
        "chunk_key_encoding": {"name": "default"},
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
        "fill_value": fill_value(zdt),
    }


def zarr3_spec(kvstore: Mapping[str, Any], metadata: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Array spec; with ``metadata`` it can be opened with ``assume_metadata`` (no metadata I/O)."""
    spec: dict[str, Any] = {
        "driver": "zarr3",
        "kvstore": dict(kvstore),
        "recheck_cached_metadata": False,
        "recheck_cached_data": False,
        "fill_missing_data_reads": False,
        # Without this, an all-zero shard is not written at all and then reads as "missing".
        "store_data_equal_to_fill_value": True,
    }
    if metadata is not None:
        spec["metadata"] = dict(metadata)
    return spec


def context_spec(*, fsync: bool = True, file_io_concurrency: int = 64, cache_bytes: int = 0,
                 request_retries: int | None = None) -> dict[str, Any]:
    """TensorStore context: fsync each file, many files in flight (parallel fsyncs keep a disk's queue
    full; one at a time is far slower), and no chunk cache (checkpoint bytes are written and read once)
    unless ``cache_bytes``: a resharding restore reads one saved chunk into several target shards, and a
    small cache lets those reads share one decoded chunk. ``request_retries``: how often an object store request
    is retried (backoff 1 s doubling to 32 s); None keeps TensorStore's 32, about 15 minutes of an outage."""
    out: dict[str, Any] = {"cache_pool": {"total_bytes_limit": int(cache_bytes)}, "file_io_sync": fsync,
                           "file_io_concurrency": {"limit": file_io_concurrency}}
    if request_retries is not None:
        for key in ("s3_request_retries", "gcs_request_retries"):
            out[key] = {"max_retries": int(request_retries)}
    return out
