"""The running service: the daemon and the pipeline that connects sources to rules and
actions, systemd integration (``sdnotify``, ``watchdog``) and logging set-up."""
