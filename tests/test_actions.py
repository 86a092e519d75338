"""Every action the policy may ask for has exactly one handler in every executor, and nothing else does."""

from __future__ import annotations

import pytest

from flare_diag.policies.actions import ACTIONS, UnknownAction, check
from flare_diag.policies.window import WindowPolicy


def test_the_runners_target_carries_out_exactly_the_catalogues_actions(tmp_path):
    from flare_diag.daemon.hosts.site import sim_site
    from flare_diag.daemon.hosts.target import Target
    target = Target(sim_site("http://127.0.0.1:9", "t0ken"), {}, "")
    assert set(target.handlers()) == set(ACTIONS)
    assert all(callable(h) for h in target.handlers().values())


def test_the_model_run_answers_exactly_the_catalogues_actions():
    from flare_diag.daemon.rehearsal.modelrun import ModelRun
    assert set(ModelRun.handlers(ModelRun.__new__(ModelRun))) == set(ACTIONS)


def test_a_misspelt_action_fails_when_the_policy_asks_for_it():
    with pytest.raises(UnknownAction, match="not one of"):
        WindowPolicy()._request("scrape_metric", {})


def test_an_action_without_the_arguments_it_takes_fails_when_the_policy_asks_for_it():
    with pytest.raises(UnknownAction, match="snapshot"):
        check("snapshot", {"what": "everything"})
    with pytest.raises(UnknownAction, match="load"):
        check("load", {"recipe": "r"})
