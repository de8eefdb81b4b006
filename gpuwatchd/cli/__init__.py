"""The command line: ``main`` parses arguments and dispatches; one module per command
group (``xid``, ``rules``, ``silence``, ``drainhelper``)."""
