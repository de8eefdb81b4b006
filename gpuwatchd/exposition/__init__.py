"""Exposition: what Prometheus and people read off a node. ``metrics`` renders the node
snapshot into the text format at scrape time (never calling NVML), ``dcgm_compat`` adds the
dcgm-exporter names, ``httpd`` serves /metrics, /healthz and /api/v1/status."""
