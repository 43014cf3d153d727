"""The server's Prometheus metrics (`GET /metrics`), in a registry of the app's own (two apps in one process,
as in the tests, never share counters)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from mmaccel.serve.batching import Call

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 300)
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
PASS_BUCKETS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.2)


class ServeMetrics:
    """The server's Prometheus metrics: requests by route and status, latency by route, and per model its queue
    depth, the requests and rows of each call, the seconds each request waited for its call and the target passes
    per generated token."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("mmaccel_requests", "HTTP requests by route and status", ["route", "status"], registry=r)
        self.latency = Histogram("mmaccel_request_seconds", "request latency by route", ["route"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.queue = Gauge("mmaccel_queue_depth", "requests waiting for a model's next call", ["model"], registry=r)
        self.batch_requests = Histogram("mmaccel_batch_requests", "requests decoded together in one call", ["model"],
                                        buckets=ROW_BUCKETS, registry=r)
        self.batch_rows = Histogram("mmaccel_batch_rows", "rows (30-s windows, images) of one call", ["model"],
                                    buckets=ROW_BUCKETS, registry=r)
        self.wait = Histogram("mmaccel_queue_seconds", "seconds a request waited for its call", ["model"],
                              buckets=LATENCY_BUCKETS, registry=r)
        self.passes = Histogram("mmaccel_target_passes_per_token", "target passes per generated token of a call "
                                "(1: plain decoding)", ["model"], buckets=PASS_BUCKETS, registry=r)

    def watch_queue(self, model: str, depth: Callable[[], int]) -> None:
        """Report `model`'s queue depth as `depth()`, read at each scrape."""
        self.queue.labels(model).set_function(depth)

    def observe_call(self, call: Call, passes_per_token: float | None) -> None:
        """Record one call of a model: its requests, its rows, each request's wait and, where given (None: not
        measured, as for images), its target passes per generated token."""
        self.batch_requests.labels(call.model).observe(call.jobs)
        self.batch_rows.labels(call.model).observe(call.rows)
        for waited in call.waited_s:
            self.wait.labels(call.model).observe(waited)
        if passes_per_token is not None:
            self.passes.labels(call.model).observe(passes_per_token)

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        """Count one answered HTTP request of `route` with its `status`, and record its latency."""
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def render(self) -> bytes:
        """The metrics in Prometheus' text format (served as `content_type`)."""
        return generate_latest(self.registry)
