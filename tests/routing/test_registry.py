"""The policy registry is the one list (issue 62 item 4): the sweep's cell roles and the
simulator's plots read one rule from it, and no old import path is left."""

from __future__ import annotations

import pytest

import rcllm.routing.policies as policies
from rcllm.routing.registry import LEGACY_POLICY_SERIES, in_role, method_policy


def test_a_cell_says_its_roles_and_an_old_cell_is_read_by_its_method():
    assert in_role({"roles": ["method", "policy"]}, "policy")
    assert not in_role({"roles": ["policy"], "method": "full", "policy": "load-only"}, "method")
    old_policy = {"method": LEGACY_POLICY_SERIES, "policy": "hit-only"}
    old_both = {"method": LEGACY_POLICY_SERIES, "policy": method_policy("rcllm")}
    old_method = {"method": "full", "policy": "load-only"}
    assert [in_role(c, "method") for c in (old_policy, old_both, old_method)] == [
        False, True, True]
    assert [in_role(c, "policy") for c in (old_policy, old_both, old_method)] == [
        True, True, False]


def test_the_simulator_s_plots_read_the_same_rule():
    from rcllm.sim.plots import method_cell, policy_cell

    cells = [{"roles": ["method"], "method": "prefix", "policy": "prefix-aware"},
             {"roles": ["policy"], "method": "rcllm-0.3/0.3", "policy": "cost"},
             {"method": LEGACY_POLICY_SERIES, "policy": "affinity"}]
    assert [method_cell(c) for c in cells] == [in_role(c, "method") for c in cells] == [
        True, False, True]
    assert [policy_cell(c) for c in cells] == [False, True, True]


def test_the_policies_module_no_longer_lends_the_registry_s_names():
    for name in ("routing_policy", "POLICIES"):
        with pytest.raises(AttributeError):
            getattr(policies, name)
