"""Prometheus metrics and the endpoints that serve them."""
