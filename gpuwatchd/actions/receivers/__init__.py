"""Receivers: turn a group notification into HTTP requests, and judge the answers.

One module per kind (``webhook``, ``slack``, ``pagerduty``, ``alertmanager``) holds its
``Receiver`` subclass, its rendering and its ``KIND``; ``registry`` lists them and builds
a configured receiver through its kind; ``base`` holds what they share (see its docstring
for the notification they render).
"""

from gpuwatchd.actions.receivers.alertmanager import AlertmanagerSender, alertmanager_alerts
from gpuwatchd.actions.receivers.base import (
    MAX_RETRY_AFTER,
    RULE_SEVERITY_LABEL,
    SOURCE_SEVERITY_LABEL,
    USER_AGENT,
    HttpRequest,
    Outcome,
    Receiver,
    ReceiverKind,
    alert_title,
    classify_http,
    daemon_url,
    external_labels,
    generator_url,
    retry_after_seconds,
)
from gpuwatchd.actions.receivers.pagerduty import (
    PD_MAX_EVENT_BYTES,
    PD_SEVERITY,
    PagerDutySender,
    pagerduty_dedup_key,
    pagerduty_event,
    pagerduty_events,
)
from gpuwatchd.actions.receivers.registry import BY_TYPE, KINDS, build_receiver
from gpuwatchd.actions.receivers.slack import (
    SLACK_MAX_ALERTS,
    SlackSender,
    slack_alert_fields,
    slack_message,
)
from gpuwatchd.actions.receivers.webhook import WebhookSender, webhook_message

__all__ = [
    "BY_TYPE",
    "KINDS",
    "MAX_RETRY_AFTER",
    "PD_MAX_EVENT_BYTES",
    "PD_SEVERITY",
    "RULE_SEVERITY_LABEL",
    "SLACK_MAX_ALERTS",
    "SOURCE_SEVERITY_LABEL",
    "USER_AGENT",
    "AlertmanagerSender",
    "HttpRequest",
    "Outcome",
    "PagerDutySender",
    "Receiver",
    "ReceiverKind",
    "SlackSender",
    "WebhookSender",
    "alert_title",
    "alertmanager_alerts",
    "build_receiver",
    "classify_http",
    "daemon_url",
    "external_labels",
    "generator_url",
    "pagerduty_dedup_key",
    "pagerduty_event",
    "pagerduty_events",
    "retry_after_seconds",
    "slack_alert_fields",
    "slack_message",
    "webhook_message",
]
