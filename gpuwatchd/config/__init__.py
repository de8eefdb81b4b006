"""Configuration: the positioned YAML reader (``yamlsrc``) and the readers of the daemon
config (``loader``), its actions and rules sections (``actions``, ``rules``) and the
exporter-toolkit web config (``web``). Every error names file, line and column."""
