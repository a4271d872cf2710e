"""kvprefix: an automatic prefix cache with block hashing for LLM serving.

The Python binding of the C library (include/kvprefix.h). A serving frontend creates one
:class:`Cache` over its KV block pool and drives each request through it::

    import kvprefix
    cache = kvprefix.Cache(n_blocks=65536, block_size=16)
    ns = kvprefix.Namespace(model="llama-3.1-8b", tenant="acme")
    m = cache.acquire(req_id, ns, prompt, capacity=len(prompt) + max_new)
    blocks = cache.request_blocks(req_id)   # prefill prompt[m.n_tokens_hit:] into blocks
    cache.commit(req_id, prompt)
    cache.release(req_id)

Tokens are any C-contiguous buffer of uint32 (``array('I')``, a numpy ``uint32`` array, a
memoryview), read in place without a copy, or any sequence of ints (checked to be in
0 .. 2**32 - 1). Errors are :class:`KvprefixError` subclasses carrying the library's code.
Block keys are 128-bit ints. docs/python.md covers threading, events and metrics.
"""

from typing import TYPE_CHECKING, Any, Dict

from ._kvprefix import (
    EBUSY,
    ECORRUPT,
    EEXIST,
    EINVAL,
    ENOENT,
    ENOMEM,
    ENOSPC,
    EOVERFLOW,
    ERANGE,
    EVENT_CLEARED,
    EVENT_REMOVED,
    EVENT_STORED,
    MAX_BLOCK_SIZE,
    OK,
    REMOVED_EVICTED,
    REMOVED_REPLACED,
    REMOVED_RESET,
    AlreadyExistsError,
    BusyError,
    Cache,
    CorruptError,
    Event,
    EventCallbackError,
    InvalidArgumentError,
    KvprefixError,
    Match,
    Namespace,
    NoSpaceError,
    NotFoundError,
    OutOfMemoryError,
    OutOfRangeError,
    Stats,
    TooLargeError,
    external_key,
    hash_blocks,
    namespace_key,
    strerror,
    version,
)

__version__ = version()

if TYPE_CHECKING:  # the collector needs prometheus_client, imported on first use below
    from .prometheus import PrometheusCollector


def stats_dict(stats: Any) -> Dict[str, Any]:
    """The fields of a :class:`Stats` (or :class:`Match`) as a dict, like dataclasses.asdict."""
    return {name: getattr(stats, name) for name in type(stats).__match_args__}


def __getattr__(name: str) -> Any:
    # The collector imports prometheus_client, an optional dependency: load it on first use.
    if name == "PrometheusCollector":
        from .prometheus import PrometheusCollector

        return PrometheusCollector
    raise AttributeError(f"module 'kvprefix' has no attribute {name!r}")


__all__ = [
    "Cache",
    "Namespace",
    "Match",
    "Stats",
    "Event",
    "KvprefixError",
    "InvalidArgumentError",
    "OutOfMemoryError",
    "NoSpaceError",
    "NotFoundError",
    "AlreadyExistsError",
    "TooLargeError",
    "OutOfRangeError",
    "BusyError",
    "CorruptError",
    "EventCallbackError",
    "PrometheusCollector",
    "hash_blocks",
    "namespace_key",
    "external_key",
    "strerror",
    "version",
    "stats_dict",
    "OK",
    "EINVAL",
    "ENOMEM",
    "ENOSPC",
    "ENOENT",
    "EEXIST",
    "EOVERFLOW",
    "ERANGE",
    "EBUSY",
    "ECORRUPT",
    "EVENT_STORED",
    "EVENT_REMOVED",
    "EVENT_CLEARED",
    "REMOVED_EVICTED",
    "REMOVED_RESET",
    "REMOVED_REPLACED",
    "MAX_BLOCK_SIZE",
]
