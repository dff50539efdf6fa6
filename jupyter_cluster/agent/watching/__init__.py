"""Watching the cluster: metrics, Prometheus, the sampler, timelines, deaths named and Ray's own logs."""
