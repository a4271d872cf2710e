"""__text_signature__: inspect.signature() and help() on every public method and constructor,
naming the parameters the functions really accept (the signatures and the argument parser
come from one table in args.c; these tests hold both to the documented API)."""

import inspect
import pydoc

import pytest

import kvprefix

P, K, O = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY,
           inspect.Parameter.POSITIONAL_ONLY)

# name -> [(parameter, kind, default or inspect.Parameter.empty)], self left out.
E = inspect.Parameter.empty
CACHE = {
    "lookup": [("ns", P, E), ("tokens", P, E)],
    "acquire": [("req_id", P, E), ("ns", P, E), ("tokens", P, E), ("capacity", P, 0)],
    "request": [("req_id", P, E), ("ns", P, E), ("tokens", P, E), ("capacity", P, 0)],
    "grow": [("req_id", P, E), ("capacity", P, E)],
    "request_blocks": [("req_id", O, E)],
    "commit": [("req_id", P, E), ("tokens", P, E)],
    "release": [("req_id", O, E)],
    "access": [("ns", P, E), ("tokens", P, E), ("retention", K, None)],
    "lookup_ids": [("ns", P, E), ("ids", P, E), ("n_tokens", P, None)],
    "access_ids": [("ns", P, E), ("ids", P, E), ("n_tokens", P, None), ("retention", K, None)],
    "keys": [("ns", P, E), ("tokens", P, E), ("raw", K, False)],
    "lookup_keys": [("ns", P, E), ("root", P, E), ("keys", P, E), ("tokens", P, None),
                    ("n_tokens", K, None)],
    "acquire_keys": [("req_id", P, E), ("ns", P, E), ("root", P, E), ("keys", P, E),
                     ("tokens", P, None), ("capacity", P, 0), ("n_tokens", K, None)],
    "commit_keys": [("req_id", P, E), ("keys", P, E), ("tokens", P, E)],
    "access_keys": [("ns", P, E), ("root", P, E), ("keys", P, E), ("tokens", P, None),
                    ("n_tokens", K, None)],
    "requests": [],
    "release_all": [],
    "set_quota": [("ns", P, E), ("max_cached_blocks", P, E)],
    "set_retention": [("req_id", P, E), ("retention", P, E)],
    "block_retention": [("block_id", O, E)],
    "hasher": [],
    "hash_blocks": [("ns", P, E), ("tokens", P, E)],
    "namespace_key": [("ns", O, E)],
    "reset": [],
    "check": [],
    "stats": [],
    "metrics": [("labels", P, None)],
    "close": [],
    "add_tier": [("medium", P, E), ("n_blocks", P, E), ("eviction", K, "lru"),
                 ("slru_protected_pct", K, 80), ("s3fifo_small_pct", K, 10),
                 ("s3fifo_ghost_pct", K, 100), ("cdecay_tau", K, 0), ("cdecay_ghost_pct", K, 0)],
    "acquire_tiers": [("req_id", P, E), ("ns", P, E), ("tokens", P, E), ("capacity", P, 0)],
    "tier_orders": [("max", P, None)],
    "tier_confirm": [("order_id", P, E), ("ok", P, True)],
    "lookup_tiers": [("ns", P, E), ("tokens", P, E)],
    "tier_stats": [("tier", P, None)],
}
HASHER = {
    "root": [("ns", O, E)],
    "blocks": [("ns", P, E), ("tokens", P, E), ("parent", P, None)],
    "external_key": [("root", P, E), ("external_id", P, E)],
}
REQUEST = {"commit": [("tokens", P, E)], "grow": [("capacity", P, E)]}
CONSTRUCTORS = {
    kvprefix.Cache: [("n_blocks", P, E), ("block_size", P, 16), ("seed", K, 0),
                     ("verify_tokens", K, False), ("on_event", K, None),
                     ("hash_profile", K, "keyed"), ("hash_key", K, None), ("vllm_seed", K, None),
                     ("vocab_size", K, 0), ("ns_quota", K, 0), ("single_threaded", K, False),
                     ("quota_scope", K, "namespace"),
                     ("eviction", K, "lru"), ("slru_protected_pct", K, 80),
                     ("s3fifo_small_pct", K, 10), ("s3fifo_ghost_pct", K, 100),
                     ("cdecay_tau", K, 0), ("cdecay_ghost_pct", K, 0), ("count_orphans", K, False),
                     ("block_bytes", K, 0)],
    kvprefix.Hasher: [("profile", P, "keyed"), ("block_size", K, 16), ("key", K, None),
                      ("seed", K, 0), ("vllm_seed", K, None), ("vocab_size", K, 0)],
    kvprefix.Namespace: [("model", P, None), ("adapter", P, None), ("tenant", P, None),
                         ("salt", P, None)],
}
FUNCTIONS = {
    kvprefix.hash_blocks: [("tokens", P, E), ("block_size", P, 16), ("seed", K, 0),
                           ("parent", K, None)],
    kvprefix.namespace_key: [("ns", P, E), ("seed", P, 0)],
    kvprefix.external_key: [("root", P, E), ("external_id", P, E), ("seed", P, 0)],
    kvprefix.strerror: [("code", O, E)],
    kvprefix.hash_profile_name: [("profile", O, E)],
    kvprefix.hash_profile_parse: [("name", O, E)],
    kvprefix.version: [],
}


def public_methods(cls):
    return sorted(n for n, v in vars(cls).items()
                  if not n.startswith("_") and callable(v))


def described(sig, skip_self):
    params = list(sig.parameters.values())[1 if skip_self else 0:]
    return [(p.name, p.kind, p.default) for p in params]


@pytest.mark.parametrize("cls,table", [(kvprefix.Cache, CACHE), (kvprefix.Hasher, HASHER),
                                       (kvprefix.Request, REQUEST)])
def test_every_public_method_has_its_signature(cls, table):
    assert public_methods(cls) == sorted(table)  # a new method needs a row here
    for name, want in table.items():
        sig = inspect.signature(getattr(cls, name))
        first = list(sig.parameters.values())[0]
        assert first.name == "self" and first.kind == O, name
        assert described(sig, True) == want, name


def test_bound_methods_and_dunders():
    c = kvprefix.Cache(16, 4)
    assert list(inspect.signature(c.acquire).parameters) == ["req_id", "ns", "tokens", "capacity"]
    assert list(inspect.signature(c.__exit__).parameters) == ["exc_type", "exc_value",
                                                              "traceback"]
    assert list(inspect.signature(kvprefix.Request.__enter__).parameters) == ["self"]


@pytest.mark.parametrize("cls", list(CONSTRUCTORS))
def test_constructors(cls):
    assert described(inspect.signature(cls), False) == CONSTRUCTORS[cls]


@pytest.mark.parametrize("fn", list(FUNCTIONS), ids=lambda f: f.__name__)
def test_module_functions(fn):
    assert described(inspect.signature(fn), False) == FUNCTIONS[fn]


def accepts_keyword(fn, name):
    """Whether fn takes a keyword argument called name (the call may fail for other reasons)."""
    try:
        fn(**{name: None})
    except TypeError as e:
        return "unexpected keyword" not in str(e) and "takes no keyword" not in str(e)
    except Exception:
        pass
    return True


def test_the_parser_accepts_what_the_signature_names(ns):
    c = kvprefix.Cache(16, 4)
    with c.request(1, ns, [1, 2, 3, 4]) as req:
        objects = [(c, CACHE), (c.hasher(), HASHER), (req, REQUEST)]
        for obj, table in objects:
            for name, params in table.items():
                fn = getattr(obj, name)
                for p, kind, _ in params:
                    assert accepts_keyword(fn, p) == (kind != O), (name, p)
                assert not accepts_keyword(fn, "no_such_parameter"), name
    for cls, params in CONSTRUCTORS.items():
        for p, _, _ in params:
            assert accepts_keyword(cls, p), (cls, p)
        assert not accepts_keyword(cls, "no_such_parameter")
    c.close()


def test_help_shows_signatures():
    text = pydoc.render_doc(kvprefix.Cache, renderer=pydoc.plaintext)
    assert "acquire(self, /, req_id, ns, tokens, capacity=0)" in text
    assert "release(self, req_id, /)" in text
    assert "Cache(n_blocks, block_size=16, *, seed=0" in text
    assert "Start a request" in text  # the docstring's body follows the signature


def test_one_mistake_one_message(cache, ns):
    """The same bad argument reads the same in every function that takes it."""
    msgs = []
    for call in (lambda: cache.acquire(-1, ns, [1]), lambda: cache.grow(-1, 4),
                 lambda: cache.release(-1), lambda: cache.commit_keys(-1, None, [1])):
        with pytest.raises(kvprefix.InvalidArgumentError) as e:
            call()
        assert e.value.code == kvprefix.EINVAL and e.value.function is None
        msgs.append(str(e.value).split(": ", 1)[1])
    assert msgs == ["req_id: -1 is not in 0 .. 2**64 - 1"] * 4
    for call, fn in ((lambda: cache.lookup(ns, [1, 2.5]), "lookup"),
                     (lambda: cache.commit(1, [1, 2.5]), "commit"),
                     (lambda: kvprefix.hash_blocks([1, 2.5]), "hash_blocks")):
        with pytest.raises(TypeError, match=rf"^{fn}\(\): tokens\[1\]: an int is needed, got "
                                            r"float$"):
            call()


def test_benchmark_hooks_are_not_shipped():
    """The benchmark's C loops live in _kvprefix_bench, built but never installed."""
    assert not any(hasattr(kvprefix.Cache, n) for n in ("_run_batch", "_time_stats"))
    import importlib.util
    import pathlib

    pkg = pathlib.Path(kvprefix.__file__).parent
    assert not list(pkg.glob("_kvprefix_bench*"))
    if importlib.util.find_spec("_kvprefix_bench") is not None:  # only on a build path
        assert "site-packages" not in importlib.util.find_spec("_kvprefix_bench").origin
