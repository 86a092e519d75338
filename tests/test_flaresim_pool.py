"""flaresim's routed pool: the other backends carry the primary's share while it is out."""

from __future__ import annotations

from flare_diag.fixtures.flaresim.pool import Pool


def _pool(**kw) -> Pool:
    return Pool(**{"backends": 3, "offered_rps": 25.0, "capacity_rps": 10.0, "base_latency_s": 0.4, **kw})


def test_a_pool_with_room_serves_everything_and_sheds_nothing():
    p = _pool()
    p.advance(10.0)
    assert p.requests == {"200": 250.0, "500": 0.0, "503": 0.0}


def test_without_the_primary_the_excess_over_the_others_capacity_is_shed():
    p = _pool()
    p.primary_admitted = False
    p.advance(10.0)
    assert p.requests["503"] == 50.0 and p.requests["200"] == 200.0
    assert p.utilization() == 1.25 and p.latency_p95_s() == 30.0


def test_latency_climbs_with_the_load_moved_onto_the_others():
    p = _pool(offered_rps=15.0)
    before = p.latency_p95_s()
    p.primary_admitted = False
    assert p.latency_p95_s() > before


def test_a_routed_fault_with_a_duration_ends_on_its_own_between_two_reads():
    p = _pool()
    p.fault_error_ratio, p.fault_until_s = 0.5, 4.0
    p.advance(10.0)
    assert p.requests["500"] == 50.0 and p.fault_error_ratio == 0.0  # 4 s at half of 25 a second
    p.advance(20.0)
    assert p.requests["500"] == 50.0
