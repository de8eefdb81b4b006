"""Kernel-log and event sources of XIDs.

Each source owns one input and only observes: ``journald`` (kernel transport of the
systemd journal), ``kmsg`` (/dev/kmsg, where there is no journald), and NVML XID events
(in the backend). Their findings go through ``KernelLineHandler`` (parse, trust, map to a
GPU) and the ``IncidentMerger`` (one incident per fault), both owned by the XID intake
(``intake.py``), which hands each incident to the node's hand-off.
"""
