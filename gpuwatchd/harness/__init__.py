"""Harnesses that drive the real pipeline on a chosen clock: ``simulate`` (virtual clock,
deterministic backtests), ``demo`` (sped-up clock, the first-run story) and ``ruletest``
(rule unit tests, like promtool's)."""
