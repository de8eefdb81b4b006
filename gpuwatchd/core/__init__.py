"""The shared vocabulary every stage speaks: typed records (samples, XIDs, device
events), alert transitions, the NVML field table, units and durations, the clock seam,
errors, metric families, the node state the poller fills and the scrape reads, worker
heartbeats, and small durable-file helpers. Imports nothing else from gpuwatchd."""
