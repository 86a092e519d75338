"""`status` says what a window waits on: each action asked and not yet answered, when it was asked, its deadline."""

from __future__ import annotations

import re

import pytest

from flare_diag.events.progress import WindowProgress
from flare_diag.events.reader import LogReader
from flare_diag.events.schema import Input
from flare_diag.policies.audit import WindowReplay
from flare_diag.policies.snapshot import snapshot
from tests.daemontools import PLAN, SCALE, Daemon, Sim
from tests.test_replay_corpus import _log


@pytest.mark.parametrize("name", ["completed-default", "restore-path", "identity-drift-tp"])
def test_the_live_view_waits_on_exactly_the_actions_the_decider_holds_outstanding(tmp_path, name):
    # two computations apart: a fold of the log's events (what status shows) and the decider replayed
    # from the inputs alone (log state); at every input they must name the same actions
    db = _log(tmp_path, name)
    with LogReader(db) as r:
        envs = list(r.iter())
    records = [(e.seq, e.window_id, e.event()) for e in envs]
    wid = envs[0].window_id
    progress = WindowProgress(wid)
    replay = WindowReplay(follow=True)
    checked = 0
    for k, (seq, w, ev) in enumerate(records):
        progress.apply(seq, ev, envs[k].wall_ns)
        replay.feed(seq, w, ev)
        nxt = records[k + 1][2] if k + 1 < len(records) else None
        if nxt is not None and not isinstance(nxt, Input):
            continue  # between an input and the decisions it caused the fold has not seen them yet
        held = snapshot(replay.policy).outstanding
        assert sorted(progress.waiting) == [o.action_id for o in held], seq
        checked += 1
    assert checked > 50
    assert progress.as_dict()["waiting"] == []  # a closed window waits on nothing


def test_status_lists_the_oldest_waits_first_with_when_each_was_asked_and_its_deadline():
    from flare_diag.daemon.cli.waiting import waiting_words
    waiting = [{"action_id": 88, "action": "load", "since_minute": 71.2, "deadline_s": 600.0},
               {"action_id": 90, "action": "scrape_metrics", "since_minute": 72.5, "deadline_s": 10.0},
               {"action_id": 91, "action": "snapshot", "since_minute": 72.5, "deadline_s": None},
               {"action_id": 92, "action": "read_identity", "since_minute": 72.6, "deadline_s": 10.0}]
    words = waiting_words(waiting, 72.9)
    assert words.startswith("#88 load (asked at minute 71.2, 1.7 min ago; deadline 600 s); #90 scrape_metrics")
    assert "#91 snapshot (asked at minute 72.5, 0.4 min ago)" in words and words.endswith("; and 1 more")


def test_an_action_whose_cancel_was_asked_is_waited_on_until_it_answers():
    from flare_diag.events.schema import ActionDone, ActionRequested, CancelRequested
    from flare_diag.events.actions import make
    p = WindowProgress("w")
    p.apply(1, ActionRequested(action_id=5, request=make("scrape_metrics", {}), deadline_s=10.0))
    p.apply(2, CancelRequested(action_ids=[5], reason="abort"))
    assert [(a["action_id"], a["cancelled"]) for a in p.as_dict()["waiting"]] == [(5, True)]
    p.apply(3, ActionDone(at_ns=1, action_id=5, ok=False, error="cancelled"))
    assert p.as_dict()["waiting"] == []


def test_an_action_asked_before_minute_0_says_so():
    from flare_diag.daemon.cli.waiting import waiting_words
    words = waiting_words([{"action_id": 9, "action": "quiesce", "since_minute": None, "deadline_s": 30.0}], None)
    assert words == "#9 quiesce (asked before minute 0; deadline 30 s)"


def test_status_of_a_window_whose_load_has_not_answered_says_it_waits_on_the_load(tmp_path):
    # recipes that take 300 window seconds to load: 3 s of real time at x100, enough for status to be asked
    # mid-load however busy the machine (a busy one only makes a load longer)
    sim = Sim(tmp_path, load_s=300.0)
    daemon = Daemon(tmp_path)
    try:
        daemon.start()
        p = daemon.cli("start", str(PLAN), "--site", sim.site.stem, "--time-scale", str(SCALE), "--accept-partial")
        assert p.returncode == 0, p.stderr

        def loading(st: dict) -> bool:
            return any(a["action"] == "load" for a in (st.get("window") or {}).get("waiting") or [])
        daemon.wait_for(loading, what="a load asked and not answered")
        out = daemon.cli("status").stdout
        assert re.search(r"waiting on\s+#\d+ load \(asked at minute [\d.]+(, [\d.]+ min ago)?; deadline [\d.]+ s\)", out), out
        daemon.cli("abort", "--reason", "test over")
    finally:
        daemon.stop()
        sim.stop()
