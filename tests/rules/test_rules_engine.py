"""The rule engine, condition by condition, with edge cases: boundaries, gaps in data,
counter resets on driver reload, a GPU lost mid-window; the state machine and metrics."""

from __future__ import annotations

import pytest
from rulekit import Node, pci_of, rules

from gpuwatchd.core.alerts import AlertSeverity, AlertState
from gpuwatchd.core.records import GpuStatus
from gpuwatchd.rules.conditions.base import Evaluator, Result
from gpuwatchd.rules.snapshot import Snapshot

TEMP = """
rules:
- name: Hot
  severity: page
  for: 5m
  condition:
    threshold: {field: temperature_gpu, op: '>', value: 85}
  annotations:
    summary: 'GPU {gpu} ({pci_bus_id}) on {node} at {value:.1f} C (limit {threshold})'
"""


# -- threshold, for, keep_firing_for --------------------------------------------------------------
def test_threshold_boundary_is_strict() -> None:
    n = Node(TEMP)
    n.set(0, temperature_gpu=85.0)
    n.run(600)
    assert not n.transitions  # 85 is not > 85
    n.set(0, temperature_gpu=85.5)
    n.step()
    assert n.events() == [(610.0, "Hot", "pending", "0")]


def test_for_fires_exactly_when_held_long_enough() -> None:
    n = Node(TEMP)
    n.set(1, temperature_gpu=90)
    n.poll()  # t=0: pending
    n.run(290)
    assert n.firing() == set()
    n.step()  # t=300: held for 5m
    assert n.firing() == {("Hot", "1")}
    assert n.events() == [(0.0, "Hot", "pending", "1"), (300.0, "Hot", "firing", "1")]
    tr = n.transitions[-1][1]
    assert tr.severity is AlertSeverity.PAGE
    assert tr.annotations["summary"] == (f"GPU 1 ({pci_of(1)}) on node-a at 90.0 C (limit 85)")
    assert tr.active_since == n.t0 and tr.sequence == 2


def test_a_dip_below_resets_the_pending_timer_and_sends_nothing() -> None:
    n = Node(TEMP)
    n.set(0, temperature_gpu=90)
    n.run(200)
    n.set(0, temperature_gpu=80)
    n.step()
    assert n.pending() == set() and n.firing() == set()
    n.set(0, temperature_gpu=90)
    n.run(290)
    assert n.firing() == set()  # the timer restarted
    n.run(20)
    assert n.firing() == {("Hot", "0")}
    assert [e[2] for e in n.events()] == ["pending", "pending", "firing"]


def test_keep_firing_for_holds_through_a_short_dip() -> None:
    n = Node(TEMP.replace("  for: 5m\n", "  for: 1m\n  keep_firing_for: 2m\n"))
    n.set(0, temperature_gpu=90)
    n.poll()
    n.run(60)
    assert n.firing() == {("Hot", "0")}
    n.set(0, temperature_gpu=80)
    n.run(110)
    assert n.firing() == {("Hot", "0")}  # still within keep_firing_for
    n.set(0, temperature_gpu=90)
    n.run(60)
    n.set(0, temperature_gpu=80)
    n.run(180)
    assert [e[2] for e in n.events()] == ["pending", "firing", "resolved"]
    resolved_at = n.events("resolved")[0][0]
    assert resolved_at == pytest.approx(230 + 120, abs=10)


def test_a_stale_gpu_holds_a_pending_alert_and_a_lost_gpu_holds_a_firing_one() -> None:
    n = Node(TEMP)
    n.set(0, temperature_gpu=90)
    n.run(100)
    n.status[0] = GpuStatus.STALE
    n.run(120)
    assert n.pending("Hot") == {("Hot", "0")}  # no data: neither resolved nor advanced
    n.status[0] = GpuStatus.OK
    n.run(100)
    assert n.firing() == {("Hot", "0")}  # the gap counted as held (for is time, not samples)
    n.status[0] = GpuStatus.LOST
    n.run(3600)
    assert n.firing() == {("Hot", "0")}  # a lost GPU does not resolve its alerts
    assert [e[2] for e in n.events()] == ["pending", "firing"]


def test_link_threshold_one_alert_per_link() -> None:
    n = Node(
        """
        rules:
        - name: LinkDown
          severity: ticket
          condition:
            threshold: {field: nvlink_up, op: '==', value: 0}
          annotations: {summary: 'GPU {gpu} link {link} down'}
        """,
        links=4,
    )
    n.poll()
    n.set_link(2, 3, nvlink_up=0)
    n.set_link(2, 1, nvlink_up=0)
    n.step()
    got = sorted((tr.labels["gpu"], tr.labels["link"]) for _, tr in n.transitions)
    assert got == [("2", "1"), ("2", "3")]
    assert n.transitions[0][1].annotations["summary"] == "GPU 2 link 1 down"
    n.set_link(2, 1, nvlink_up=1)
    n.step()
    assert n.events("resolved") == [(20.0, "LinkDown", "resolved", "2")]


# -- increase, rate, count: windows and counter resets --------------------------------------------
ECC = """
rules:
- name: EccRising
  severity: ticket
  condition:
    increase: {field: ecc_corrected_volatile, window: 1h}
  annotations: {summary: '{value:.0f} in {window}'}
- name: EccFast
  severity: page
  condition:
    rate: {field: ecc_corrected_volatile, window: 10m, op: '>=', value: 0.1}
- name: EccOften
  severity: ticket
  condition:
    count: {field: ecc_corrected_volatile, window: 1h, value: 3}
"""


def test_increase_fires_and_resolves_when_the_errors_leave_the_window() -> None:
    n = Node(ECC)
    n.run(600)
    n.add(3, ecc_corrected_volatile=2)
    n.step()
    assert n.firing() == {("EccRising", "3")}
    assert n.transitions[-1][1].annotations["summary"] == "2 in 1h"
    n.run(3590)
    assert n.firing() == {("EccRising", "3")}
    n.run(20)
    assert n.firing() == set()
    assert n.events("resolved") == [(4210.0, "EccRising", "resolved", "3")]


def test_a_driver_reload_resetting_the_volatile_counter_is_not_an_increase() -> None:
    n = Node(ECC)
    n.set(0, ecc_corrected_volatile=50)  # history before gpuwatchd started: not an increase
    n.run(600)
    n.set(0, ecc_corrected_volatile=0)  # driver reload: counter starts over
    n.run(600)
    assert n.firing() == set() and not n.transitions
    n.set(0, ecc_corrected_volatile=2)  # two new errors after the reload
    n.step()
    assert n.firing() == {("EccRising", "0")}
    assert n.engine.alerts()[0].value == 2.0


def test_a_gpu_lost_mid_window_keeps_its_counted_errors() -> None:
    n = Node(ECC)
    n.run(60)
    n.add(1, ecc_corrected_volatile=1)
    n.step()
    n.status[1] = GpuStatus.LOST
    n.run(1800)
    assert n.firing() == {("EccRising", "1")}  # the error happened; the window still has it
    n.status[1] = GpuStatus.OK
    n.set(1, ecc_corrected_volatile=0)  # it came back after a reset: counter cleared
    n.run(1800)
    assert n.firing() == set()
    assert [e[2] for e in n.events()] == ["firing", "resolved"]


def test_rate_and_count() -> None:
    n = Node(ECC)
    n.run(60)
    for _ in range(3):
        n.add(2, ecc_corrected_volatile=20)
        n.step(60)
    assert ("EccFast", "2") in n.firing()  # 60 in 10m = 0.1/s
    assert ("EccOften", "2") in n.firing()  # grew in 3 samples
    n.run(700, step=60)
    assert ("EccFast", "2") not in n.firing()
    assert ("EccOften", "2") in n.firing()


def test_count_needs_distinct_increments() -> None:
    n = Node(ECC)
    n.run(60)
    n.add(0, ecc_corrected_volatile=500)  # one jump of 500 is one increment
    n.step()
    assert ("EccOften", "0") not in n.firing()


# -- XIDs -----------------------------------------------------------------------------------------
XIDS = """
rules:
- name: XidFatal
  severity: page
  condition:
    xid: {codes: [79, 48], quiet: 30m}
  annotations:
    summary: 'XID {xid} GPU {gpu}: {xid_text}'
    action: '{action}'
  drain: true
- name: XidRepeated
  severity: ticket
  condition:
    xid: {codes: [13], count: 3, window: 10m, by_code: true}
- name: AppXid
  severity: info
  condition:
    xid: {buckets: [RESTART_APP], by_code: true, quiet: 5m}
"""


def test_xid_fires_at_once_and_resolves_after_the_quiet_period() -> None:
    n = Node(XIDS)
    n.poll()
    n.xid(2, 79, message="GPU has fallen off the bus.")
    n.step()
    assert n.firing() == {("XidFatal", "2")}
    tr = n.transitions[-1][1]
    assert tr.drain and tr.severity is AlertSeverity.PAGE
    assert tr.annotations["summary"] == "XID 79 GPU 2: GPU has fallen off the bus"
    assert tr.annotations["action"] == "Reboot the node."
    n.run(1200)
    n.xid(2, 48)  # another matching XID restarts the quiet period, no second page
    n.step()
    n.run(1790)
    assert n.firing() == {("XidFatal", "2")}
    n.run(20)
    assert n.firing() == set()
    assert [e[2] for e in n.events()] == ["firing", "resolved"]


def test_xid_count_within_window() -> None:
    n = Node(XIDS)
    n.poll()
    n.xid(1, 13)  # t=0
    n.step(300)
    n.xid(1, 13)  # t=300
    n.step(350)
    n.xid(1, 13)  # t=650: the first one left the 10m window
    n.step()
    assert ("XidRepeated", "1") not in n.firing()  # never 3 within 10m
    n.xid(1, 13)  # t=660: 300, 650, 660
    n.step()
    assert ("XidRepeated", "1") in n.firing()
    labels = n.engine.alerts(AlertState.FIRING)[-1].labels
    assert labels["xid"] == "13"


def test_untrusted_xids_and_sxids_never_fire() -> None:
    n = Node(XIDS)
    n.xid(0, 79, trusted=False, source="syslog")
    n.xid(0, 79, kind="sxid")
    n.run(60)
    assert not n.transitions  # an SXid is never an XID rule's, whatever its code
    assert n.engine.xids_ignored == 1  # the SXid went to the sxid rules' own log


def test_xid_without_gpu_index_is_matched_by_pci_bus_id_or_kept_on_the_node() -> None:
    n = Node(XIDS)
    n.xid(None, 79, pci_bus_id=pci_of(3))
    n.xid(None, 48, pci_bus_id="00000000:FF:00.0")
    n.step()
    got = sorted(
        (tr.labels.get("gpu") or "-", tr.annotations["summary"]) for _, tr in n.transitions
    )
    assert got == [
        ("-", "XID 48 GPU n/a: Double Bit ECC Error"),
        ("3", "XID 79 GPU 3: GPU has fallen off the bus"),
    ]


def test_xids_of_ignored_gpus_never_fire() -> None:
    n = Node(XIDS)
    n.engine.ignore = frozenset({pci_of(2)})
    n.xid(None, 79, pci_bus_id=pci_of(2).lower())
    n.step()
    assert not n.transitions


def test_xid_by_bucket_and_one_alert_per_code() -> None:
    n = Node(XIDS)
    n.xid(0, 13)
    n.xid(0, 31)
    n.step()
    assert sorted(tr.labels["xid"] for _, tr in n.transitions if tr.rule == "AppXid") == [
        "13",
        "31",
    ]


# -- throttle -------------------------------------------------------------------------------------
THROTTLE = """
rules:
- name: Thermal
  severity: ticket
  for: 5m
  condition:
    throttle: {reasons: [hw_thermal_slowdown, sw_thermal_slowdown]}
  annotations: {summary: '{reasons}'}
- name: Both
  severity: info
  condition:
    throttle: {reasons: [hw_thermal_slowdown, sw_thermal_slowdown], match: all}
"""


def test_a_single_hw_slowdown_sample_does_not_fire_a_sustained_one_does() -> None:
    n = Node(THROTTLE)
    n.set(0, clock_event_reasons=0x40)
    n.step()
    n.set(0, clock_event_reasons=0x1)  # back to idle
    n.run(600)
    assert n.firing("Thermal") == set()
    n.set(0, clock_event_reasons=0x40 | 0x4)  # hw thermal + sw power cap
    n.run(310)
    assert n.firing("Thermal") == {("Thermal", "0")}
    assert n.transitions[-1][1].annotations["summary"] == "hw_thermal_slowdown"
    assert n.firing("Both") == set()
    n.set(0, clock_event_reasons=0x60)
    n.step()
    assert n.firing("Both") == {("Both", "0")}


# -- trend ----------------------------------------------------------------------------------------
TREND = """
rules:
- name: Accelerating
  severity: page
  condition:
    trend: {field: ecc_corrected_volatile, window: 1d, baseline: 7d, factor: 4,
            min_increase: 12, slices: 6, min_slices: 3}
  annotations: {summary: 'x{ratio:.1f}, {value:.0f} in {window}'}
"""
HOUR = 3600.0
DAY = 86400.0


def _errors_every(n: Node, gpu: int, every: float, until: float, step: float = 1800.0) -> None:
    next_error = n.t + every
    while n.t + step <= until:
        n.clock.advance(step)
        while next_error <= n.t:
            n.add(gpu, ecc_corrected_volatile=1)
            next_error += every
        n.poll()


def test_trend_pages_on_acceleration() -> None:
    n = Node(TREND, gpus=2)
    n.poll()
    _errors_every(n, 1, DAY, 9 * DAY)  # one a day for 9 days
    assert n.firing() == set()
    _errors_every(n, 1, HOUR, 11 * DAY)  # then one an hour
    fired = n.events("firing")
    assert fired and fired[0][1:] == ("Accelerating", "firing", "1")
    assert 9 * DAY < fired[0][0] < 10 * DAY
    assert n.transitions[0][1].annotations["summary"].startswith("x")


def test_trend_steady_trickle_and_single_burst_do_not_page() -> None:
    trickle = Node(TREND, gpus=2)
    trickle.poll()
    _errors_every(trickle, 1, HOUR, 20 * DAY)  # 24 a day, every day
    assert not trickle.transitions
    burst = Node(TREND, gpus=2)
    burst.run(10 * DAY, step=1800)
    burst.add(1, ecc_corrected_volatile=400)
    burst.run(3 * DAY, step=1800)
    assert not burst.transitions


def test_trend_needs_history_covering_the_baseline() -> None:
    n = Node(TREND, gpus=1)
    n.poll()
    _errors_every(n, 0, HOUR, 3 * DAY)  # a high rate from the start: no baseline to compare
    assert not n.transitions


# -- peer outliers --------------------------------------------------------------------------------
PEERS = """
rules:
- name: SlowClock
  severity: ticket
  when: {field: utilization_gpu, op: '>', value: 0.5}
  condition:
    peer_outlier: {field: sm_clock, direction: below, ratio: 0.85}
  annotations: {summary: '{value:.3g} vs {peers_median:.3g}'}
- name: EccOutlier
  severity: ticket
  condition:
    peer_outlier: {field: ecc_corrected_volatile, direction: above, ratio: 10, min_delta: 100,
                   window: 1h}
"""


def test_peer_outlier_on_a_gauge_under_load_only() -> None:
    n = Node(PEERS)
    n.set(2, sm_clock=1.5e9)
    n.step()
    assert n.firing() == {("SlowClock", "2")}
    assert n.transitions[0][1].annotations["summary"] == "1.5e+09 vs 1.98e+09"
    n.set(2, utilization_gpu=0.0)  # the job stopped on that GPU: not compared any more
    n.step()
    assert n.firing() == set()
    n.set([0, 1, 2, 3], sm_clock=1.0e9, utilization_gpu=0.9)  # all slow alike: no outlier
    n.step()
    assert n.firing() == set()


def test_peer_outlier_on_a_counter_rate_needs_peers_and_a_real_difference() -> None:
    n = Node(PEERS)
    n.run(60)
    n.add(1, ecc_corrected_volatile=50)  # 50 above peers at 0: below min_delta
    n.step()
    assert n.firing("EccOutlier") == set()
    n.add(1, ecc_corrected_volatile=5000)  # the DCGM #313 case
    n.step()
    assert n.firing("EccOutlier") == {("EccOutlier", "1")}
    lonely = Node(PEERS, gpus=2)  # one peer is fewer than min_peers (2)
    lonely.run(60)
    lonely.add(1, ecc_corrected_volatile=5000)
    lonely.step()
    assert lonely.firing("EccOutlier") == set()


# -- GPU status, count, PCIe, stuck work ----------------------------------------------------------
STATUS = """
rules:
- name: Lost
  severity: page
  condition:
    gpu_status: {status: [lost]}
  drain: true
- name: Stale
  severity: ticket
  for: 2m
  condition:
    gpu_status: {status: [stale, error]}
- name: Missing
  severity: page
  condition:
    gpu_count: {}
  annotations: {summary: '{value:.0f} of {expected} ({seen} NVML, {pci_seen} PCI)'}
"""


def test_gpu_lost_pages_immediately_and_resolves_on_recovery() -> None:
    n = Node(STATUS)
    n.poll()
    n.status[3] = GpuStatus.LOST
    n.step()
    assert n.firing() == {("Lost", "3")}
    assert n.transitions[-1][1].drain
    n.status[3] = GpuStatus.OK
    n.step()
    assert n.firing() == set()


def test_stale_needs_two_minutes() -> None:
    n = Node(STATUS)
    n.status[1] = GpuStatus.STALE
    n.run(60)
    n.status[1] = GpuStatus.OK
    n.run(60)
    assert n.firing() == set()
    n.status[1] = GpuStatus.STALE
    n.run(130)
    assert n.firing() == {("Stale", "1")}


def test_fewer_gpus_than_expected_from_nvml_or_pci() -> None:
    n = Node(STATUS, gpus=8, expected=8)
    n.poll()
    assert n.firing() == set()
    n.state.set_pci_gpus(7)  # udev saw one leave the bus
    n.step()
    assert n.firing() == {("Missing", None)}
    assert n.transitions[-1][1].annotations["summary"] == "7 of 8 (8 NVML, 7 PCI)"
    assert n.transitions[-1][1].labels == {"node": "node-a"}
    n.state.set_pci_gpus(8)
    n.step()
    assert n.firing() == set()
    short = Node(STATUS, gpus=7, expected=8)  # NVML sees 7 at start
    short.poll()
    assert short.firing() == {("Missing", None)}
    unset = Node(STATUS, gpus=7)  # gpus.expected not configured: nothing to compare
    unset.poll()
    assert unset.firing() == set()


LINKS = """
rules:
- name: Downtrained
  severity: ticket
  for: 10m
  when: {field: utilization_gpu, op: '>', value: 0.5}
  condition:
    pcie_downtrained: {}
  annotations:
    summary: 'Gen{generation:.0f} x{width:.0f} of Gen{generation_max:.0f} x{width_max:.0f}'
- name: Stuck
  severity: page
  for: 10m
  condition:
    stuck_workload: {max_utilization: 0}
"""


def test_pcie_downtrained_under_load_only() -> None:
    n = Node(LINKS)
    n.set(0, pcie_link_generation=1, utilization_gpu=0.0)  # idle GPUs drop to Gen1: fine
    n.run(1200)
    assert n.firing("Downtrained") == set()
    n.set(0, utilization_gpu=0.95, pcie_link_generation=5, pcie_link_width=8)
    n.run(610)
    assert n.firing("Downtrained") == {("Downtrained", "0")}
    assert n.engine.alerts(AlertState.FIRING)[0].annotations["summary"] == "Gen5 x8 of Gen5 x16"


def test_stuck_workload_needs_a_process_and_zero_utilization() -> None:
    n = Node(LINKS)
    n.set(1, utilization_gpu=0.0)  # a process at 0%
    n.set(2, utilization_gpu=0.0, compute_processes=0)  # an idle GPU: fine
    n.run(590)
    assert n.firing("Stuck") == set()
    n.run(20)
    assert n.firing("Stuck") == {("Stuck", "1")}
    n.set(1, utilization_gpu=0.4)
    n.step()
    assert n.firing("Stuck") == set()


# -- labels, fingerprints, sequence, select -------------------------------------------------------
def test_labels_fingerprints_and_sequence_numbers() -> None:
    n = Node(
        TEMP.replace("  for: 5m\n", "  labels: {team: infra}\n"),
    )
    n.set(2, temperature_gpu=90)
    n.step()
    n.set(2, temperature_gpu=60)
    n.step()
    n.set(2, temperature_gpu=90)
    n.step()
    trs = [tr for _, tr in n.transitions]
    assert [(t.state.value, t.sequence) for t in trs] == [
        ("firing", 1),
        ("resolved", 2),
        ("firing", 3),
    ]
    assert len({t.fingerprint for t in trs}) == 1
    assert dict(trs[0].labels) == {
        "node": "node-a",
        "gpu": "2",
        "uuid": n.infos[2].uuid,
        "pci_bus_id": n.infos[2].pci_bus_id,
        "model": "NVIDIA H100 80GB HBM3",
        "team": "infra",
    }
    assert len({t.idempotency_key for t in trs}) == 3


def test_select_limits_the_gpus() -> None:
    n = Node(TEMP.replace("  for: 5m\n", f"  select: {{gpus: ['{n_uuid(1)}', '{pci_of(2)}']}}\n"))
    n.set([0, 1, 2, 3], temperature_gpu=90)
    n.step()
    assert n.firing() == {("Hot", "1"), ("Hot", "2")}


def n_uuid(i: int) -> str:
    from rulekit import uuid_of

    return uuid_of(i)


# -- reload and metrics ---------------------------------------------------------------------------
def test_metrics_exist_at_zero_for_every_rule_from_the_start() -> None:
    n = Node(TEMP + XIDS.replace("rules:\n", ""))
    text = n.metrics()
    for rule in ("Hot", "XidFatal", "XidRepeated", "AppXid"):
        assert f'gpuwatchd_rule_evaluations_total{{rule="{rule}"}} 0.0' in text
        for state in ("pending", "firing", "resolved"):
            assert f'gpuwatchd_alert_transitions_total{{rule="{rule}",state="{state}"}} 0.0' in text
    assert 'gpuwatchd_alerts{rule="Hot",severity="page",state="firing"} 0.0' in text
    assert 'gpuwatchd_alerts{rule="AppXid",severity="info",state="pending"} 0.0' in text
    assert "gpuwatchd_rules_loaded 4.0" in text
    assert "gpuwatchd_rules_reload_success 1.0" in text
    assert "gpuwatchd_rule_evaluation_duration_seconds 0.0" in text
    n.set(0, temperature_gpu=99)
    n.run(310)
    text = n.metrics()
    assert 'gpuwatchd_rule_evaluations_total{rule="Hot"} 31.0' in text
    assert 'gpuwatchd_alerts{rule="Hot",severity="page",state="firing"} 1.0' in text
    assert 'gpuwatchd_alert_transitions_total{rule="Hot",state="pending"} 1.0' in text
    assert 'gpuwatchd_alert_transitions_total{rule="Hot",state="firing"} 1.0' in text


def test_replace_rules_keeps_states_and_resolves_removed_rules() -> None:
    both = rules(TEMP + XIDS.replace("rules:\n", ""))
    n = Node(both)
    n.set(0, temperature_gpu=99)
    n.run(300)
    n.xid(1, 79)
    n.step()
    assert n.firing() == {("Hot", "0"), ("XidFatal", "1")}
    n.engine.replace_rules(rules(TEMP))
    n.step()
    assert n.firing() == {("Hot", "0")}  # kept: no second page
    last = n.transitions[-1][1]
    assert (last.rule, last.state.value) == ("XidFatal", "resolved")
    assert last.annotations["resolved_reason"] == "the rule was removed or disabled"
    assert [e[2] for e in n.events() if e[1] == "Hot"] == ["pending", "firing"]
    assert "XidFatal" not in n.metrics()


def test_a_failing_rule_is_counted_and_the_others_still_run() -> None:
    n = Node(TEMP + ECC.replace("rules:\n", ""))

    class Broken(Evaluator):
        def evaluate(self, snap: Snapshot, now: float, active: bool, fresh: bool) -> Result:
            raise RuntimeError("bug")

    loaded = n.engine._loaded["Hot"]
    loaded.evaluator = Broken(loaded.rule)
    n.poll()
    n.add(0, ecc_corrected_volatile=1)
    n.run(290)
    assert n.firing("EccRising") == {("EccRising", "0")}
    text = n.metrics()
    # the rule runs again only when the field it reads changes: once so far (its first)
    assert 'gpuwatchd_rule_evaluation_failures_total{rule="Hot"} 1.0' in text
    assert 'gpuwatchd_rule_evaluation_failures_total{rule="EccRising"} 0.0' in text
    for temperature in (50.0, 51.0, 52.0):
        n.set(0, temperature_gpu=temperature)
        n.step()
    assert 'gpuwatchd_rule_evaluation_failures_total{rule="Hot"} 4.0' in n.metrics()


def test_an_xid_seen_later_than_its_window_still_pages() -> None:
    # simulate polls every 30 minutes: the XID 48 line is evaluated 30 minutes after its
    # own time, longer than the 10-minute count window (it used to be lost).
    n = Node("rules:\n- name: Dbe\n  severity: page\n  condition:\n    xid: {codes: [48]}\n", 2)
    n.poll()
    n.xid(1, 48)
    n.clock.advance(1800)
    n.poll()
    assert n.firing() == {("Dbe", "1")}


def test_a_firing_alert_text_follows_its_values_across_repeated_polls() -> None:
    # The re-render is skipped while the inputs are the same; every change shows, also a
    # change back to an earlier value (the resolve says what held last).
    n = Node(TEMP)
    n.set(1, temperature_gpu=90)
    n.poll()
    n.run(300)
    assert n.firing() == {("Hot", "1")}
    n.set(1, temperature_gpu=95)
    n.run(60)
    n.set(1, temperature_gpu=90)
    n.run(60)
    n.set(1, temperature_gpu=80)
    n.step()
    tr = n.transitions[-1][1]
    assert tr.state is AlertState.RESOLVED
    assert tr.annotations["summary"] == f"GPU 1 ({pci_of(1)}) on node-a at 90.0 C (limit 85)"
    n2 = Node(TEMP)
    n2.set(1, temperature_gpu=90)
    n2.poll()
    n2.run(300)
    assert n2.firing() == {("Hot", "1")}
    n2.set(1, temperature_gpu=95)
    n2.run(60)
    n2.set(1, temperature_gpu=80)
    n2.step()
    assert n2.transitions[-1][1].annotations["summary"].endswith("at 95.0 C (limit 85)")
