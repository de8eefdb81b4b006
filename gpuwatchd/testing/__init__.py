"""Test helpers shipped with gpuwatchd: fakes for each seam (NVML, clock, ...)."""
