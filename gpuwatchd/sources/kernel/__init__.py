"""Kernel-log sources of XID lines: journald (``journald``), /dev/kmsg (``kmsg``), the
trusted-line handler (``linehandler``) and the saved read position (``cursor``)."""
