//! Prometheus metrics (issue 4).
