"""Scenarios: the YAML format of scripted GPU timelines and faults (``model``) and the
backend that plays one (``backend``). A product feature for drills, backtests and demos, and
the stand-in for NVML where there is no GPU."""
