"""Where the site's configuration lives: /etc/gpuwatchd, or ``$GPUWATCHD_CONFIG_DIR``.

The variable exists for packaging layouts other than Debian's and for tests, which must
never read the configuration of the host they run on.
"""

from __future__ import annotations

import os

CONFIG_DIR_ENV = "GPUWATCHD_CONFIG_DIR"
SYSTEM_CONFIG_DIR = "/etc/gpuwatchd"


def config_dir() -> str:
    return os.environ.get(CONFIG_DIR_ENV) or SYSTEM_CONFIG_DIR


def default_config_path() -> str:
    """The config file ``run``, ``status`` and the other commands read without ``-c``."""
    return os.path.join(config_dir(), "gpuwatchd.yaml")


def default_rule_files() -> tuple[str, ...]:
    """The site rule files loaded when the config names none."""
    return (os.path.join(config_dir(), "rules.d", "*.yaml"),)
