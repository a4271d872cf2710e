"""Type hints for the kvprefix C extension (python/kvprefix/*.c; kvpy.h lists the files)."""

from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

# Tokens: any C-contiguous 1-D buffer of uint32 (array('I'), numpy.uint32, memoryview),
# read in place, or a sequence of ints in 0 .. 2**32 - 1.
Tokens = Union[Sequence[int], memoryview, Any]
# Block ids for the _ids forms: ints of up to 128 bits, or a buffer of uint64 (lo, hi)
# pairs, or bytes holding 16 bytes per key.
Ids = Union[Sequence[int], bytes, memoryview, Any]
# Retention options (Cache.set_retention, access(retention=...)): keys "priority" (0..100),
# "duration" (requests; 0 never lapses) and "ranges" ((start, end, priority[, duration]) tuples).
Retention = Dict[str, Any]
# Block keys for the *_keys forms: the same forms as Ids (Cache.keys returns ints, or bytes
# with raw=True).
Keys = Ids
Labels = Union[Mapping[str, str], Iterable[Tuple[str, str]], None]
# A hash profile: its name ("keyed", "xxh3", "siphash", "vllm-sha256-cbor",
# "vllm-xxhash-cbor") or a HASH_* constant.
Profile = Union[str, int]
Scope = Union[str, int]  # "namespace", "tenant", "model" or a QUOTA_SCOPE_* int

OK: int
EINVAL: int
ENOMEM: int
ENOSPC: int
ENOENT: int
EEXIST: int
EOVERFLOW: int
ERANGE: int
EBUSY: int
ECORRUPT: int
ETOKEN: int
ENOTSUP: int
ETOOBIG: int
HASH_KEYED: int
HASH_XXH3: int
HASH_SIPHASH: int
HASH_VLLM_SHA256: int
HASH_VLLM_XXHASH: int
HASH_KEY_MIN: int
HASH_KEY_MAX: int
QUOTA_UNLIMITED: int
QUOTA_SCOPE_NAMESPACE: int
QUOTA_SCOPE_TENANT: int
QUOTA_SCOPE_MODEL: int
VLLM_SEED_DEFAULT: str
EVENT_STORED: int
EVENT_REMOVED: int
EVENT_CLEARED: int
REMOVED_EVICTED: int
REMOVED_RESET: int
REMOVED_REPLACED: int  # no longer emitted; kept so that existing code still runs
MAX_BLOCK_SIZE: int
MAX_TIERS: int
ORDER_LOAD: int
ORDER_STORE: int
__version__: str

class KvprefixError(Exception):
    code: int
    function: Optional[str]
    detail: Optional[str]  # the library's kvp_errmsg(): which argument and why

class InvalidArgumentError(KvprefixError, ValueError): ...
class OutOfMemoryError(KvprefixError, MemoryError): ...
class NoSpaceError(KvprefixError): ...
class NotFoundError(KvprefixError, LookupError): ...
class AlreadyExistsError(KvprefixError): ...
class TooLargeError(KvprefixError): ...
class OutOfRangeError(KvprefixError): ...
class BusyError(KvprefixError): ...
class CorruptError(KvprefixError): ...
class TokenError(KvprefixError, ValueError): ...
class NotSupportedError(KvprefixError): ...
class RequestTooBigError(KvprefixError): ...

class EventCallbackError(KvprefixError):
    result: Any

class Match(Tuple[Any, ...]):
    n_tokens: int
    n_blocks_full: int
    n_blocks_cached: int
    n_blocks_hit: int
    n_tokens_hit: int
    block_ids: Optional[List[int]]
    n_blocks_stored: int

class Stats(Tuple[int, ...]):
    n_requests: int
    n_lookups: int
    n_tokens_queried: int
    n_tokens_hit: int
    n_blocks_hit: int
    n_blocks_missed: int
    n_blocks_stored: int
    n_blocks_deduped: int
    n_evictions: int
    n_verify_rejects: int
    n_blocks_total: int
    n_blocks_free: int
    n_blocks_cached: int
    n_blocks_in_use: int
    n_requests_active: int
    n_blocks_orphaned: int

class Event(Tuple[Any, ...]):
    type: int
    reason: int
    block_id: int
    n_tokens: int
    key: int
    parent: int
    parent_is_root: bool
    tier: int
    medium: Optional[str]

class TierOrder(Tuple[Any, ...]):
    id: int
    kind: int
    tier: int
    tier_block: int
    device_block: int
    block_index: int
    key: int
    req_id: int

class TierMatch(Tuple[Any, ...]):
    n_blocks_full: int
    n_blocks_prefix: int
    n_blocks_usable: int
    blocks_per_tier: Tuple[int, ...]
    where: List[int]

class TierStats(Tuple[Any, ...]):
    medium: str
    n_blocks_total: int
    n_blocks_ready: int
    n_blocks_pending: int
    n_blocks_loading: int
    n_hits: int
    n_loads: int
    n_loads_failed: int
    n_stores: int
    n_stores_failed: int
    n_stores_skipped: int
    n_evictions: int
    n_bytes_loaded: int
    n_bytes_stored: int

class Chain(Tuple[Any, ...]):
    key: int
    high: int
    root: int
    n_blocks: int
    digest: bytes
    event: int

Field = Union[str, bytes, None]

class Namespace:
    def __init__(
        self,
        model: Field = None,
        adapter: Field = None,
        tenant: Field = None,
        salt: Field = None,
    ) -> None: ...
    @property
    def model(self) -> Field: ...
    @property
    def adapter(self) -> Field: ...
    @property
    def tenant(self) -> Field: ...
    @property
    def salt(self) -> Field: ...
    def key(self, seed: int = 0) -> int: ...
    def __hash__(self) -> int: ...
    def __eq__(self, other: object) -> bool: ...

class Cache:
    def __init__(
        self,
        n_blocks: int,
        block_size: int = 16,
        *,
        seed: int = 0,
        verify_tokens: bool = False,
        on_event: Optional[Callable[[Event], Any]] = None,
        hash_profile: Profile = "keyed",
        hash_key: Optional[bytes] = None,
        vllm_seed: Optional[str] = None,
        vocab_size: int = 0,
        ns_quota: int = 0,
        single_threaded: bool = False,
        quota_scope: Scope = "namespace",
        eviction: Union[str, int] = "lru",
        slru_protected_pct: int = 80,
        s3fifo_small_pct: int = 10,
        s3fifo_ghost_pct: int = 100,
        cdecay_tau: int = 0,
        cdecay_ghost_pct: int = 0,
        count_orphans: bool = False,
        block_bytes: int = 0,
    ) -> None: ...
    @property
    def n_blocks(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def verify_tokens(self) -> bool: ...
    @property
    def on_event(self) -> Optional[Callable[[Event], Any]]: ...
    @property
    def closed(self) -> bool: ...
    @property
    def hash_profile(self) -> str: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def ns_quota(self) -> int: ...
    @property
    def single_threaded(self) -> bool: ...
    @property
    def quota_scope(self) -> str: ...
    @property
    def eviction(self) -> str: ...
    def lookup(self, ns: Optional[Namespace], tokens: Tokens) -> Match: ...
    def acquire(
        self, req_id: int, ns: Optional[Namespace], tokens: Tokens, capacity: int = 0
    ) -> Match: ...
    def request(
        self, req_id: int, ns: Optional[Namespace], tokens: Tokens, capacity: int = 0
    ) -> "Request": ...
    def grow(self, req_id: int, capacity: int) -> None: ...
    def request_blocks(self, req_id: int, /) -> List[int]: ...
    def commit(self, req_id: int, tokens: Tokens) -> int: ...
    def release(self, req_id: int, /) -> None: ...
    def access(
        self, ns: Optional[Namespace], tokens: Tokens, *, retention: Optional[Retention] = None
    ) -> Match: ...
    def add_tier(self, medium: str, n_blocks: int) -> int: ...
    def acquire_tiers(
        self, req_id: int, ns: Optional[Namespace], tokens: Tokens, capacity: int = 0
    ) -> Tuple[Match, List[TierOrder]]: ...
    def tier_orders(self, max: Optional[int] = None) -> List[TierOrder]: ...
    def tier_confirm(self, order_id: int, ok: bool = True) -> None: ...
    def lookup_tiers(self, ns: Optional[Namespace], tokens: Tokens) -> TierMatch: ...
    def tier_stats(self, tier: Optional[int] = None) -> Any: ...
    def access(self, ns: Optional[Namespace], tokens: Tokens) -> Match: ...
    def lookup_ids(
        self, ns: Optional[Namespace], ids: Ids, n_tokens: Optional[int] = None
    ) -> Match: ...
    def access_ids(
        self,
        ns: Optional[Namespace],
        ids: Ids,
        n_tokens: Optional[int] = None,
        *,
        retention: Optional[Retention] = None,
    ) -> Match: ...
    def keys(
        self, ns: Optional[Namespace], tokens: Tokens, *, raw: bool = False
    ) -> Tuple[int, Union[List[int], bytes]]: ...
    def lookup_keys(
        self,
        ns: Optional[Namespace],
        root: int,
        keys: Keys,
        tokens: Optional[Tokens] = None,
        *,
        n_tokens: Optional[int] = None,
    ) -> Match: ...
    def acquire_keys(
        self,
        req_id: int,
        ns: Optional[Namespace],
        root: int,
        keys: Keys,
        tokens: Optional[Tokens] = None,
        capacity: int = 0,
        *,
        n_tokens: Optional[int] = None,
    ) -> Match: ...
    def commit_keys(self, req_id: int, keys: Optional[Keys], tokens: Tokens) -> int: ...
    def access_keys(
        self,
        ns: Optional[Namespace],
        root: int,
        keys: Keys,
        tokens: Optional[Tokens] = None,
        *,
        n_tokens: Optional[int] = None,
    ) -> Match: ...
    def requests(self) -> List[int]: ...
    def release_all(self) -> int: ...
    def set_quota(self, ns: Optional[Namespace], max_cached_blocks: Optional[int]) -> None: ...
    def set_retention(self, req_id: int, retention: Retention) -> None: ...
    def block_retention(self, block_id: int, /) -> int: ...
    def hasher(self) -> "Hasher": ...
    def hash_blocks(self, ns: Optional[Namespace], tokens: Tokens) -> List[int]: ...
    def namespace_key(self, ns: Optional[Namespace], /) -> int: ...
    def reset(self) -> None: ...
    def check(self) -> None: ...
    def stats(self) -> Stats: ...
    def metrics(self, labels: Labels = None) -> str: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Cache": ...
    def __exit__(self, exc_type: object, exc_value: object, traceback: object, /) -> None: ...

class Request:
    """One request of a Cache as a context manager (Cache.request): entering acquires,
    leaving releases, also when the body raises. Entered once; not constructible directly."""

    @property
    def req_id(self) -> int: ...
    @property
    def active(self) -> bool: ...
    @property
    def match(self) -> Match: ...  # ValueError before entry; readable after the exit
    @property
    def blocks(self) -> List[int]: ...  # ValueError unless active
    def commit(self, tokens: Tokens) -> int: ...
    def grow(self, capacity: int) -> None: ...
    def __enter__(self) -> "Request": ...
    def __exit__(self, exc_type: object, exc_value: object, traceback: object, /) -> bool: ...

class Hasher:
    def __init__(
        self,
        profile: Profile = "keyed",
        *,
        block_size: int = 16,
        key: Optional[bytes] = None,
        seed: int = 0,
        vllm_seed: Optional[str] = None,
        vocab_size: int = 0,
    ) -> None: ...
    @property
    def profile(self) -> str: ...
    @property
    def block_size(self) -> int: ...
    def root(self, ns: Optional[Namespace], /) -> Chain: ...
    def blocks(
        self, ns: Optional[Namespace], tokens: Tokens, parent: Optional[Chain] = None
    ) -> List[Chain]: ...
    def external_key(self, root: int, external_id: int) -> int: ...

def hash_profile_name(profile: int, /) -> str: ...
def hash_profile_parse(name: Profile, /) -> int: ...
def hash_blocks(
    tokens: Tokens, block_size: int = 16, *, seed: int = 0, parent: Optional[int] = None
) -> List[int]: ...
def namespace_key(ns: Optional[Namespace], seed: int = 0) -> int: ...
def external_key(root: int, external_id: int, seed: int = 0) -> int: ...
def strerror(code: int, /) -> str: ...
def version() -> str: ...
def _token_address(tokens: Tokens, /) -> Tuple[int, bool]: ...
