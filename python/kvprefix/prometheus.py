"""A prometheus_client collector for kvprefix caches.

The exposition text comes from the C library (kvp_cache_metrics, the same text a C host
serves); the collector parses it with prometheus_client's own parser and yields the
families, so a Python frontend registers its caches next to its other metrics::

    from prometheus_client import REGISTRY, start_http_server
    REGISTRY.register(kvprefix.PrometheusCollector(cache, labels={"model": "llama-3.1-8b"}))

Several caches (one per model or engine) can share one collector: pass
``caches=[(cache_a, {"model": "a"}), (cache_b, {"model": "b"})]``; their samples are merged
into one family per metric, told apart by the labels.
"""

from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from ._kvprefix import Cache


class PrometheusCollector:
    """Collects kvprefix metrics from one or more caches at each scrape."""

    def __init__(
        self,
        cache: Optional[Cache] = None,
        labels: Optional[Dict[str, str]] = None,
        *,
        caches: Sequence[Tuple[Cache, Dict[str, str]]] = (),
    ) -> None:
        self._caches: List[Tuple[Cache, Dict[str, str]]] = list(caches)
        if cache is not None:
            self._caches.insert(0, (cache, dict(labels or {})))
        if not self._caches:
            raise ValueError("PrometheusCollector: no cache given")

    def collect(self) -> Iterator[Metric]:
        """Yield one family per kvprefix metric, with the samples of every cache."""
        merged: Dict[str, Metric] = {}
        for cache, labels in self._caches:
            if cache.closed:
                continue
            for family in text_string_to_metric_families(cache.metrics(labels)):
                if family.name in merged:
                    merged[family.name].samples.extend(family.samples)
                else:
                    merged[family.name] = family
        return iter(merged.values())

    def describe(self) -> Iterable[Metric]:
        """The families without waiting for a scrape (prometheus_client calls this once)."""
        return list(self.collect())
