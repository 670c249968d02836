"""bench/scale_out_sim.py, at small scale: the host model's arithmetic against closed forms, the
capacity bound, the driver's accounting (every request collected exactly once, with host losses
and with end-game copies), determinism, and the figures it takes from the real moebatch-plan
($MOEBATCH_BUILD_DIR/engine/moebatch-plan, default build/)."""
import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import scale_out_sim as sim  # noqa: E402

# A small host: 300 sequences per pass, 150 generated tokens/s, 16 tokens per request, so a
# request holds its slot S = 300 * 16 / 150 = 32 s.
MODEL = sim.HostModel(rate=150.0, slots=300, gen_tokens=16)
QUIET = dict(poll_s=0, shard_overhead_s=0, request_overhead_s=0, driver_cpu_per_shard_s=0,
             driver_cpu_per_request_s=0, losses=0)


def test_service_time():
    assert MODEL.service_s == pytest.approx(32.0)


@pytest.mark.parametrize("requests", [1, 299, 300, 301, 1000, 12345])
def test_one_host_one_job_runs_in_waves(requests):
    """C slots, first come first served, every request S long: n requests given at once end
    after ceil(n / C) waves of S."""
    cfg = sim.Config(hosts=1, requests=requests, shard_requests=requests, in_flight=1, **QUIET)
    run = sim.simulate(cfg, MODEL)
    assert run["makespan_s"] == pytest.approx(math.ceil(requests / 300) * 32.0)
    assert run["requests_collected"] == requests and run["exactly_once"]


def test_shards_all_in_flight_equal_one_job():
    """Every shard submitted at once (in_flight >= shards), nothing else in the way: the same
    waves as one job."""
    cfg = sim.Config(hosts=1, requests=1000, shard_requests=70, in_flight=100, **QUIET)
    assert sim.simulate(cfg, MODEL)["makespan_s"] == pytest.approx(4 * 32.0)


def test_one_shard_at_a_time_waits_for_each():
    """in_flight 1 and shards of at most C: each shard is one wave, one after the other, with the
    poll delay and the two transfers between them."""
    cfg = sim.Config(hosts=1, requests=1000, shard_requests=250, in_flight=1,
                     **{**QUIET, "shard_overhead_s": 1.0})
    # Each of the 4 shards: submitted (1 s), one wave (32 s), fetched (1 s).
    assert sim.simulate(cfg, MODEL)["makespan_s"] == pytest.approx(4 * (1 + 32 + 1))


def test_equal_hosts_without_losses_reach_hosts_times_one_host():
    """Equal hosts, no losses, the queue kept above C ((in_flight - 1) * shard >= C): the total is
    hosts x one host but for the tail, and never above the capacity hosts x R."""
    cfg = sim.Config(hosts=8, requests=200_000, shard_requests=200, in_flight=3, poll_s=5.0,
                     losses=0)
    result = sim.evaluate(cfg, MODEL)
    assert result["exactly_once"] and result["requests_collected"] == 200_000
    capacity = cfg.hosts * MODEL.rate
    assert result["throughput_tokens_s"] <= capacity * (1 + 1e-9)
    assert result["makespan_s"] >= result["ideal_makespan_s"]
    # The tail: at most a couple of slot times and a poll beyond one host's own run.
    single = sim.one_host(cfg, MODEL)
    assert result["makespan_s"] <= single["makespan_s"] + 2 * MODEL.service_s + cfg.poll_s + 1
    assert 0.97 <= result["ratio"] <= 1.0 + 1e-9
    assert result["resubmitted_shards"] == 0 and result["wasted_host_s"] == 0


def test_a_short_queue_starves_the_host():
    """Shards of 100 one at a time keep 100 of 300 slots busy: about a third of the rate."""
    cfg = sim.Config(hosts=2, requests=20_000, shard_requests=100, in_flight=1, **QUIET)
    result = sim.evaluate(cfg, MODEL)
    assert result["ratio"] == pytest.approx(1 / 3, rel=0.05)


@pytest.mark.parametrize("copies", [False, True])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_losses_every_request_exactly_once(seed, copies):
    cfg = sim.Config(hosts=10, requests=100_000, shard_requests=500, in_flight=3, losses=3,
                     detect_s=30.0, host_spread=0.05, end_game_copies=copies, seed=seed)
    result = sim.evaluate(cfg, MODEL)
    assert result["exactly_once"]
    assert result["requests_collected"] == cfg.requests
    assert result["resubmitted_shards"] > 0 and result["wasted_host_s"] > 0
    # Losing hosts never speeds the batch up, and the lost hosts' time is missing.
    assert result["makespan_s"] >= result["no_loss_makespan_s"]
    assert result["alive_host_s"] < cfg.hosts * result["makespan_s"]
    if copies:
        assert result["end_game_copies"] >= result["end_game_copies_won"]


def test_end_game_copies_happen_and_keep_one_result():
    cfg = sim.Config(hosts=10, requests=50_000, shard_requests=1000, in_flight=3, losses=0,
                     host_spread=0.3, end_game_copies=True, seed=4)
    result = sim.simulate(cfg, MODEL)
    assert result["end_game_copies"] > 0
    assert result["exactly_once"] and result["requests_collected"] == cfg.requests


def test_deterministic_for_a_seed():
    cfg = sim.Config(hosts=10, requests=50_000, shard_requests=500, losses=2, host_spread=0.05)
    assert sim.simulate(cfg, MODEL) == sim.simulate(cfg, MODEL)
    other = sim.simulate(dataclasses.replace(cfg, seed=2), MODEL)
    assert other["makespan_s"] != sim.simulate(cfg, MODEL)["makespan_s"]


def test_bad_configurations_are_refused():
    for bad in (dict(hosts=0), dict(losses=10, hosts=10), dict(in_flight=0),
                dict(host_spread=1.0)):
        with pytest.raises(ValueError):
            sim.simulate(sim.Config(**{"requests": 100, **bad}), MODEL)


PLAN = sim.default_plan()


def test_host_model_from_the_real_plan():
    assert PLAN.exists(), f"{PLAN} is not built (scripts/build.sh; MOEBATCH_BUILD_DIR)"
    model = sim.host_model_from_plan(PLAN, "mixtral-8x7b", "t4", 98, 128, 70, 100_000, 10**6)
    # The streaming rate is above the rate of a finite batch (whose fill and drain it pays), and
    # the slot model's own one-host run of that batch lands near the plan's figure for it.
    assert model.rate > model.plan_share_rate > 0
    assert model.slots > 100
    single = sim.one_host(sim.Config(hosts=1, requests=100_000), model)
    assert single["throughput_tokens_s"] / model.plan_share_rate == pytest.approx(1, abs=0.05)
    # --max_in_flight caps the sequences per pass.
    capped = sim.host_model_from_plan(PLAN, "mixtral-8x7b", "t4", 98, 128, 70, 100_000, 512)
    assert capped.slots == 512 and capped.rate == model.rate
    # Longer generations: the same tokens/s, more time per request.
    longer = sim.host_model_from_plan(PLAN, "mixtral-8x7b", "t4", 98, 512, 70, 100_000, 10**6)
    assert longer.service_s > model.service_s


def test_command_line_small_run():
    assert PLAN.exists(), f"{PLAN} is not built"
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "scale_out_sim.py"), "--plan",
                          str(PLAN), "--hosts", "10", "--requests", "100000", "--losses", "2",
                          "--json"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["exactly_once"] and result["requests_collected"] == 100_000
    assert result["plan_command"].startswith("moebatch-plan --preset mixtral-8x7b --gpu t4")
    assert 0 < result["ratio"] <= 1.0 + 1e-9
