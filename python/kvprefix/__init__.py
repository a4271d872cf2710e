"""kvprefix: an automatic prefix cache with block hashing for LLM serving.

The Python binding of the C library (include/kvprefix.h). A serving frontend creates one
:class:`Cache` over its KV block pool and drives each request through it::

    import kvprefix
    cache = kvprefix.Cache(n_blocks=65536, block_size=16)
    ns = kvprefix.Namespace(model="llama-3.1-8b", tenant="acme")
    with cache.request(req_id, ns, prompt, capacity=len(prompt) + max_new) as req:
        prefill(prompt[req.match.n_tokens_hit:], req.blocks)
        req.commit(prompt)
    # left: released, also when the body raised

(or cache.acquire / request_blocks / commit / release, one call each).

Tokens are any C-contiguous buffer of uint32 (``array('I')``, a numpy ``uint32`` array, a
memoryview), read in place without a copy, or any sequence of ints (checked to be in
0 .. 2**32 - 1). Errors are :class:`KvprefixError` subclasses carrying the library's code.
Block keys are 128-bit ints, computed by the cache's hash profile (``keyed`` by default, with
a random key per cache; ``xxh3``, ``siphash``, or vLLM's exact ``vllm-sha256-cbor`` and
``vllm-xxhash-cbor``); :class:`Hasher` computes them outside any cache, e.g. in a router.
A Cache may be shared by threads: calls release the GIL and lookups run in parallel.
docs/python.md covers threading, events, hash profiles and metrics.
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
    ETOKEN,
    ETOOBIG,
    ENOTSUP,
    EVENT_CLEARED,
    EVENT_REMOVED,
    EVENT_STORED,
    HASH_KEY_MAX,
    HASH_KEY_MIN,
    HASH_KEYED,
    HASH_SIPHASH,
    HASH_VLLM_SHA256,
    HASH_VLLM_XXHASH,
    HASH_XXH3,
    MAX_BLOCK_SIZE,
    MAX_TIERS,
    OK,
    ORDER_LOAD,
    ORDER_STORE,
    QUOTA_SCOPE_MODEL,
    QUOTA_SCOPE_NAMESPACE,
    QUOTA_SCOPE_TENANT,
    QUOTA_UNLIMITED,
    REMOVED_EVICTED,
    REMOVED_REPLACED,
    REMOVED_RESET,
    AlreadyExistsError,
    BusyError,
    Cache,
    Chain,
    CorruptError,
    Event,
    EventCallbackError,
    Hasher,
    InvalidArgumentError,
    KvprefixError,
    Match,
    Namespace,
    NoSpaceError,
    NotFoundError,
    NotSupportedError,
    OutOfMemoryError,
    OutOfRangeError,
    Request,
    RequestTooBigError,
    Stats,
    TierMatch,
    TierOrder,
    TierStats,
    TokenError,
    TooLargeError,
    VLLM_SEED_DEFAULT,
    external_key,
    hash_blocks,
    hash_profile_name,
    hash_profile_parse,
    namespace_key,
    strerror,
    version,
)

__version__ = version()

try:  # libkvprefix-events' codec and publisher: built with ZeroMQ and msgpack-c only
    from ._kvevents import Publisher, decode_batch, encode_batch

    _KV_EVENTS = ["Publisher", "decode_batch", "encode_batch"]
except ImportError:  # pragma: no cover - a build without libkvprefix-events
    _KV_EVENTS = []

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
    "Request",
    "Match",
    "Stats",
    "Event",
    "TierOrder",
    "TierMatch",
    "TierStats",
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
    "TokenError",
    "NotSupportedError",
    "RequestTooBigError",
    "EventCallbackError",
    "Hasher",
    "Chain",
    "hash_profile_name",
    "hash_profile_parse",
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
    "ETOKEN",
    "ENOTSUP",
    "ETOOBIG",
    "HASH_KEYED",
    "HASH_XXH3",
    "HASH_SIPHASH",
    "HASH_VLLM_SHA256",
    "HASH_VLLM_XXHASH",
    "HASH_KEY_MIN",
    "HASH_KEY_MAX",
    "QUOTA_UNLIMITED",
    "QUOTA_SCOPE_NAMESPACE",
    "QUOTA_SCOPE_TENANT",
    "QUOTA_SCOPE_MODEL",
    "VLLM_SEED_DEFAULT",
    "EVENT_STORED",
    "EVENT_REMOVED",
    "EVENT_CLEARED",
    "REMOVED_EVICTED",
    "REMOVED_RESET",
    "REMOVED_REPLACED",
    "MAX_BLOCK_SIZE",
    "MAX_TIERS",
    "ORDER_LOAD",
    "ORDER_STORE",
]
__all__ += _KV_EVENTS
