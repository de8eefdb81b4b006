"""The receivers, routing and drain config sections: every mistake with its location,
secrets never echoed, round trip, and secret files read at start-up."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpuwatchd.actions import ActionsError, build_actions
from gpuwatchd.actions.drain.drivers.kubernetes import KubernetesDrainConfig
from gpuwatchd.actions.receivers.alertmanager import AlertmanagerReceiver
from gpuwatchd.actions.receivers.pagerduty import PagerDutyReceiver
from gpuwatchd.actions.receivers.slack import SlackReceiver
from gpuwatchd.actions.receivers.webhook import WebhookReceiver
from gpuwatchd.config.actions import DrainConfig, RouteConfig, RoutingConfig
from gpuwatchd.configfile.loader import ConfigError, load_config
from gpuwatchd.configfile.stages import for_actions
from gpuwatchd.core.clock import VirtualClock

DURATION_HELP = (
    "(use a number and a unit with no space: 250ms, 30s, 5m, 2h, 1d, 1w; combined like 1h30m)"
)


def errors(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(str(path), must_exist=True, environ={})
    return [line.removeprefix(str(tmp_path) + "/") for line in info.value.lines()]


def load(tmp_path: Path, text: str) -> object:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return load_config(str(path), must_exist=True, environ={})


FULL = """\
receivers:
  - name: ops
    type: webhook
    url: https://hooks.example/gpu/T0KEN
    headers: {X-Team: gpu}
    header_files: {Authorization: hook-token}
    hmac_secret_file: /etc/gpuwatchd/hmac.key
    signature_header: X-Signature
    timeout: 5s
    send_resolved: false
  - name: chat
    type: slack
    url_file: slack-url
    min_interval: 2s
  - name: pd
    type: pagerduty
    routing_key_file: /etc/gpuwatchd/pd.key
    url: https://events.eu.pagerduty.com/v2/enqueue
  - name: am
    type: alertmanager
    urls: [http://am1:9093, http://am2:9093]
    resend_interval: 30s
routing:
  receivers: [chat]
  min_severity: page
  group_by: [node, gpu]
  group_wait: 2s
  repeat_interval: 1h
  routes:
    - match: {severity: page}
      match_re: {rule: "xid_.*"}
      receivers: [pd, chat]
      group_by: [node]
      group_wait: 0s
      repeat_interval: 30m
  queue_size: 50
  retry_initial: 500ms
  retry_max: 1m
  give_up_after: 12h
drain:
  mode: kubernetes
  dry_run: true
  node: k8s-node-17
  grace: 1m
  rule_grace: {gpu_lost: 0s}
  notify_command: [/usr/local/bin/checkpoint-now, --all]
  state_file: /run/gw/health.json
  max_drains: 1
  window: 30m
  resume: true
  resume_hold: 1h
  timeout: 10s
  attempts: 3
  exec: {command: [/bin/true]}
  slurm: {scontrol: /usr/bin/scontrol, sinfo: /usr/bin/sinfo}
  kubernetes:
    kubeconfig: /etc/gpuwatchd/kubeconfig
    taint: false
    taint_key: example.com/gpu-bad
    taint_effect: NoExecute
    condition: false
    condition_type: GpuBroken
"""


def test_every_actions_setting_is_read(tmp_path: Path) -> None:
    cfg = load(tmp_path, FULL)
    assert cfg.receivers == (  # type: ignore[attr-defined]
        WebhookReceiver(
            name="ops",
            url="https://hooks.example/gpu/T0KEN",
            headers={"X-Team": "gpu"},
            header_files={"Authorization": "hook-token"},
            hmac_secret_file="/etc/gpuwatchd/hmac.key",
            signature_header="X-Signature",
            timeout=5.0,
            send_resolved=False,
        ),
        SlackReceiver(name="chat", url_file="slack-url", min_interval=2.0),
        PagerDutyReceiver(
            name="pd",
            routing_key_file="/etc/gpuwatchd/pd.key",
            url="https://events.eu.pagerduty.com/v2/enqueue",
        ),
        AlertmanagerReceiver(
            name="am", urls=("http://am1:9093", "http://am2:9093"), resend_interval=30.0
        ),
    )
    assert cfg.routing == RoutingConfig(  # type: ignore[attr-defined]
        receivers=("chat",),
        min_severity="page",
        group_by=("node", "gpu"),
        group_wait=2.0,
        repeat_interval=3600.0,
        routes=(
            RouteConfig(
                receivers=("pd", "chat"),
                match={"severity": "page"},
                match_re={"rule": "xid_.*"},
                group_by=("node",),
                group_wait=0.0,
                repeat_interval=1800.0,
            ),
        ),
        queue_size=50,
        retry_initial=0.5,
        retry_max=60.0,
        give_up_after=43200.0,
    )
    drain = cfg.drain  # type: ignore[attr-defined]
    assert isinstance(drain, DrainConfig)
    assert (drain.mode, drain.dry_run, drain.node, drain.grace) == (
        "kubernetes",
        True,
        "k8s-node-17",
        60.0,
    )
    assert drain.rule_grace == {"gpu_lost": 0.0}
    assert drain.notify_command == ("/usr/local/bin/checkpoint-now", "--all")
    assert (drain.max_drains, drain.window, drain.resume, drain.resume_hold) == (
        1,
        1800.0,
        True,
        3600.0,
    )
    assert (drain.timeout, drain.attempts, drain.state_file) == (10.0, 3, "/run/gw/health.json")
    assert drain.section("kubernetes", KubernetesDrainConfig) == KubernetesDrainConfig(
        kubeconfig="/etc/gpuwatchd/kubeconfig",
        taint=False,
        taint_key="example.com/gpu-bad",
        taint_effect="NoExecute",
        condition=False,
        condition_type="GpuBroken",
    )


def test_actions_sections_round_trip_without_secrets(tmp_path: Path) -> None:
    cfg = load(tmp_path, FULL.replace("url: https://hooks.example/gpu/T0KEN", "url_file: hook-url"))
    plain = cfg.as_dict()  # type: ignore[attr-defined]
    again = load(tmp_path, yaml.safe_dump(plain))
    assert again == cfg
    minimal = load(
        tmp_path,
        "receivers:\n  - {name: a, type: slack, url_file: a}\n"
        "routing:\n  routes:\n    - {receivers: [a]}\ndrain: {mode: slurm}\n",
    )
    assert load(tmp_path, yaml.safe_dump(minimal.as_dict())) == minimal  # type: ignore[attr-defined]
    shown = load(tmp_path, FULL).as_dict()  # type: ignore[attr-defined]
    assert shown["receivers"][0]["url"] == "<secret>"
    assert "T0KEN" not in yaml.safe_dump(shown)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "receivers:\n  - name: a\n    type: webhok\n    url: http://x/\n",
            [
                "cfg.yaml:3:11: receivers[0].type: 'webhok' is not one of webhook, slack, "
                "pagerduty, alertmanager (did you mean 'webhook'?)"
            ],
        ),
        (
            "receivers:\n  - name: a\n    type: webhook\n    url: ftp://T0KEN@x/\n",
            ["cfg.yaml:4:10: receivers[0].url: the value is not an http:// or https:// URL"],
        ),
        (
            "receivers:\n  - name: a\n    type: webhook\n",
            ["cfg.yaml:2:5: receivers[0]: missing 'url' or 'url_file'"],
        ),
        (
            "receivers:\n  - {name: a, type: webhook, url: 'http://x/'}\n"
            "  - {name: a, type: slack, url: 'http://y/'}\n",
            ["cfg.yaml:3:12: receivers[1].name: 'a' is used twice"],
        ),
        (
            "receivers:\n  - {name: pd, type: pagerduty, routing_key: k, colour: red}\n",
            ["cfg.yaml:2:49: receivers[0] (pagerduty): unknown key 'colour'"],
        ),
        (
            "receivers:\n  - {name: a, type: slack, url_file: rel/path}\n",
            [
                "cfg.yaml:2:38: receivers[0].url_file: 'rel/path' is neither an absolute path nor "
                "a "
                "credential name (a file in $CREDENTIALS_DIRECTORY: letters, digits, '_', '.', "
                "'@', "
                "'-')"
            ],
        ),
        (
            "receivers:\n  - {name: am, type: alertmanager, urls: []}\n",
            ["cfg.yaml:2:42: receivers[0].urls: needs at least one Alertmanager URL"],
        ),
        (
            "receivers:\n  - {name: w, type: webhook, url: 'http://x/', headers: "
            "{Idempotency-Key: x}}\n",
            [
                "cfg.yaml:2:57: receivers[0].headers: 'Idempotency-Key' is set by gpuwatchd and "
                "cannot be configured"
            ],
        ),
        (
            "receivers:\n  - {name: ops, type: webhook, url: 'http://x/'}\nrouting:\n"
            "  receivers: [opz]\n  min_severity: warning\n  group_wait: 1x\n  routes:\n"
            "    - match: {severity: page}\n      receivers: []\n"
            "    - match_re: {gpu: '(['}\n      receivers: [ops]\n",
            [
                "cfg.yaml:4:15: routing.receivers: no receiver is named 'opz' (did you mean "
                "'ops'?)",
                "cfg.yaml:5:17: routing.min_severity: 'warning' is not one of page, ticket, info",
                f"cfg.yaml:6:15: routing.group_wait: '1x' is not a duration {DURATION_HELP}",
                "cfg.yaml:9:18: routing.routes[0].receivers: name at least one receiver",
                "cfg.yaml:10:17: routing.routes[1].match_re.gpu: '([' bad regex: unterminated "
                "character set at position 1",
            ],
        ),
        (
            "drain:\n  mode: exec\n",
            [
                "cfg.yaml:2:9: drain.mode: 'exec' needs drain.exec.command (a list: program and "
                "arguments)"
            ],
        ),
        (
            "drain:\n  mode: slurmm\n  max_drains: 0\n  window: 0s\n  state_file: run/h.json\n"
            "  kubernetes: {taint_effect: NoEvict, condition_type: lower}\n"
            "  slurm: {scontrol: 'sudo scontrol'}\n",
            [
                "cfg.yaml:2:9: drain.mode: 'slurmm' is not one of none, exec, slurm, kubernetes "
                "(did you mean 'slurm'?)",
                "cfg.yaml:3:15: drain.max_drains: must be >= 1, got 0",
                "cfg.yaml:4:11: drain.window: must be more than 0s, got '0s'",
                "cfg.yaml:5:15: drain.state_file: 'run/h.json' is not an absolute path",
                "cfg.yaml:6:30: drain.kubernetes.taint_effect: 'NoEvict' is not one of "
                "NoSchedule, PreferNoSchedule, NoExecute (did you mean 'NoExecute'?)",
                "cfg.yaml:6:55: drain.kubernetes.condition_type: 'lower' is not a condition type "
                "(CamelCase)",
                "cfg.yaml:7:21: drain.slurm.scontrol: 'sudo scontrol' is not a program name or "
                "path",
            ],
        ),
    ],
    ids=[
        "type",
        "url-secret-not-echoed",
        "missing-url",
        "duplicate",
        "unknown-key",
        "secret-ref",
        "no-urls",
        "reserved-header",
        "routing",
        "exec-needs-command",
        "drain",
    ],
)
def test_mistakes_are_reported_with_their_location(
    tmp_path: Path, text: str, expected: list[str]
) -> None:
    got = errors(tmp_path, text)
    assert got == expected
    assert not any("T0KEN" in line for line in got)


def test_secrets_come_from_files_and_credentials(tmp_path: Path) -> None:
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "pd-key").write_text("  PDKEY123\n")
    cfg = load(
        tmp_path,
        f"node_name: n1\nstate_dir: {tmp_path / 'state'}\n"
        "receivers:\n  - {name: pd, type: pagerduty, routing_key_file: pd-key}\n",
    )
    clock = VirtualClock()
    sink = build_actions(for_actions(cfg), clock, environ={"CREDENTIALS_DIRECTORY": str(creds)})
    assert sink is not None
    try:
        assert sink.receivers["pd"].secrets == ("PDKEY123",)
    finally:
        sink.close()
    with pytest.raises(
        ActionsError,
        match=r"'pd-key' names a systemd credential, but \$CREDENTIALS_DIRECTORY is not set",
    ):
        build_actions(for_actions(cfg), clock, environ={})
    (creds / "pd-key").write_text("\n")
    with pytest.raises(ActionsError, match="pd-key is empty"):
        build_actions(for_actions(cfg), clock, environ={"CREDENTIALS_DIRECTORY": str(creds)})


def test_nothing_configured_builds_nothing(tmp_path: Path) -> None:
    cfg = load(tmp_path, "node_name: n1\n")
    assert build_actions(for_actions(cfg), VirtualClock()) is None


CATASTROPHIC = ["(a+)+$", "(?:a?){25}a{25}", "(.*a){12}x", "(a|aa)*b", "(x)\\1", ".*a.*a.*a.*a.*b"]


@pytest.mark.parametrize("pattern", CATASTROPHIC)
def test_catastrophic_route_regexes_are_refused(tmp_path: Path, pattern: str) -> None:
    """Issue 15 item 7, failed on main: ``(a+)+$`` passed check-config and then froze the
    whole daemon (the match holds the GIL) on a label value of 30 a's and a b."""
    text = (
        "receivers:\n  - {name: ops, type: webhook, url: 'http://x/'}\nrouting:\n  routes:\n"
        f"    - match_re: {{alertname: '{pattern}'}}\n      receivers: [ops]\n"
    )
    (line,) = errors(tmp_path, text)
    assert line.startswith(f"cfg.yaml:5:17: routing.routes[0].match_re.alertname: {pattern!r} ")
    assert "exponential time" in line or "quantifiers in a row" in line, line


def test_ordinary_route_regexes_still_load(tmp_path: Path) -> None:
    for pattern in ("GpuXid.*|GpuEcc.*", "page|ticket", "gpu-?[0-9]+", "(a|b)*c", "x{3}(ab){2}"):
        text = (
            "receivers:\n  - {name: ops, type: webhook, url: 'http://x/'}\nrouting:\n"
            f"  routes:\n    - match_re: {{alertname: '{pattern}'}}\n      receivers: [ops]\n"
        )
        load(tmp_path, text)
