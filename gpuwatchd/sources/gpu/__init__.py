"""GPU sources: the backend seam (``backend``), the NVML backend (``nvml``), the per-GPU
poller (``poller``) and the PCI bus watcher (``pci``)."""
