"""Every receiver kind, and ``build_receiver``, which turns a configured receiver into a
ready one through its kind.

Adding a kind: write ``actions/receivers/<kind>.py`` (its config type and reader, its
``Receiver`` subclass, how it renders and judges, and a ``KIND``: see
``base.ReceiverKind``) and add its ``KIND`` here. The config loader
(``configfile/loader.py``, above every stage) reads the ``receivers`` list through
``READERS``, so the new ``type`` is accepted with no other change.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gpuwatchd.actions.receivers import alertmanager, pagerduty, slack, webhook
from gpuwatchd.actions.receivers.base import Receiver, ReceiverKind
from gpuwatchd.actions.secrets import read_secret
from gpuwatchd.config.receivers import ReceiverConfig, ReceiverReader

KINDS: tuple[ReceiverKind, ...] = (
    webhook.KIND,
    slack.KIND,
    pagerduty.KIND,
    alertmanager.KIND,
)

BY_TYPE: Mapping[str, ReceiverKind] = MappingProxyType({k.type: k for k in KINDS})
READERS: Mapping[str, ReceiverReader] = MappingProxyType({k.type: k.reader for k in KINDS})


def build_receiver(
    cfg: ReceiverConfig, environ: Mapping[str, str] | None = None, *, load_secrets: bool = True
) -> Receiver:
    """A ready receiver; reads its secrets (``SecretError`` when one cannot be read).

    ``load_secrets=False`` (simulate, which records instead of sending) reads nothing and
    uses placeholders."""

    def read(ref: str, key: str) -> str:
        if not load_secrets:
            return "http://secret.invalid/" if key.endswith("url_file") else "secret"
        return read_secret(ref, environ, what=f"receiver {cfg.name!r} {key}")

    return BY_TYPE[cfg.type].build(cfg, read)
