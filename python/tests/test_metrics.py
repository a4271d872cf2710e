"""Prometheus metrics: the library's text parsed by prometheus_client, and the collector."""

import pytest

import kvprefix
from conftest import prompt

parser = pytest.importorskip("prometheus_client.parser")
prometheus_client = pytest.importorskip("prometheus_client")


def busy(ns):
    c = kvprefix.Cache(8, 4)
    c.access(ns, prompt(17))
    c.access(ns, prompt(17))
    c.lookup(ns, prompt(17))
    c.access(ns, prompt(17, seed=2))
    c.acquire(1, ns, prompt(8), 12)
    return c


def families(text):
    return {f.name: f for f in parser.text_string_to_metric_families(text)}


def test_parses_and_matches_stats(ns):
    c = busy(ns)
    s = c.stats()
    fam = families(c.metrics())
    expect = {
        "kvprefix_prefix_cache_queries": s.n_tokens_queried,
        "kvprefix_prefix_cache_hits": s.n_tokens_hit,
        "kvprefix_requests": s.n_requests,
        "kvprefix_lookups": s.n_lookups,
        "kvprefix_block_hits": s.n_blocks_hit,
        "kvprefix_block_misses": s.n_blocks_missed,
        "kvprefix_blocks_stored": s.n_blocks_stored,
        "kvprefix_blocks_deduped": s.n_blocks_deduped,
        "kvprefix_evictions": s.n_evictions,
        "kvprefix_verify_rejects": s.n_verify_rejects,
    }
    for name, value in expect.items():
        f = fam[name]
        assert f.type == "counter"
        assert [(x.name, x.value) for x in f.samples] == [(name + "_total", value)]
    assert s.n_evictions > 0 and s.n_tokens_hit > 0
    by_state = {x.labels["state"]: x.value for x in fam["kvprefix_blocks"].samples}
    assert fam["kvprefix_blocks"].type == "gauge"
    assert by_state == {
        "free": s.n_blocks_free,
        "cached": s.n_blocks_cached,
        "in_use": s.n_blocks_in_use,
    }
    assert fam["kvprefix_pool_blocks"].samples[0].value == 8
    assert fam["kvprefix_requests_active"].samples[0].value == 1
    usage = fam["kvprefix_kv_cache_usage_perc"].samples[0].value
    assert usage == pytest.approx(s.n_blocks_in_use / 8)
    assert all(f.documentation for f in fam.values())


def test_labels_round_trip(ns):
    c = busy(ns)
    labels = {"model": 'llama "3"\\8b\nnew', "engine": "vllm", "tenant": "café €"}
    fam = families(c.metrics(labels))
    for f in fam.values():
        for x in f.samples:
            assert {k: x.labels[k] for k in labels} == labels
    assert families(c.metrics([("a", "1")]))["kvprefix_requests"].samples[0].labels == {"a": "1"}


@pytest.mark.parametrize(
    "labels", [{"state": "x"}, {"__x": "y"}, {"a-b": "c"}, {"": "c"}, {"a": "b\0c"}]
)
def test_bad_labels(ns, labels):
    c = kvprefix.Cache(8, 4)
    with pytest.raises(kvprefix.InvalidArgumentError) as e:
        c.metrics(labels)
    assert e.value.code == kvprefix.EINVAL


def test_label_types(ns):
    c = kvprefix.Cache(8, 4)
    with pytest.raises(TypeError):
        c.metrics({"a": 1})
    with pytest.raises(TypeError):
        c.metrics([("a",)])


def test_collector(ns):
    a = busy(ns)
    b = kvprefix.Cache(16, 4)
    b.access(ns, prompt(9))
    reg = prometheus_client.CollectorRegistry()
    reg.register(kvprefix.PrometheusCollector(caches=[(a, {"model": "a"}), (b, {"model": "b"})]))
    assert reg.get_sample_value("kvprefix_requests_total", {"model": "a"}) == a.stats().n_requests
    assert reg.get_sample_value("kvprefix_requests_total", {"model": "b"}) == 1
    assert reg.get_sample_value("kvprefix_blocks", {"model": "b", "state": "cached"}) == 2
    text = prometheus_client.generate_latest(reg).decode()
    back = families(text)
    assert len(back["kvprefix_evictions"].samples) >= 2
    b.access(ns, prompt(9, seed=3))  # collected at each scrape, not at registration
    assert reg.get_sample_value("kvprefix_requests_total", {"model": "b"}) == 2
    one = prometheus_client.CollectorRegistry()
    one.register(kvprefix.PrometheusCollector(b, {"engine": "x"}))
    assert one.get_sample_value("kvprefix_pool_blocks", {"engine": "x"}) == 16
    with pytest.raises(ValueError):
        kvprefix.PrometheusCollector()
