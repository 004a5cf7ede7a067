"""Operating the marketplace: Prometheus metrics, health and readiness, JSON logs, traces.

docs/deploy.md ("Observability") is the operator's side of it."""
