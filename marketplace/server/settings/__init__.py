"""Settings modules: `base` (environment-driven, the default), `production`, `test`."""
