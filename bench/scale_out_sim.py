#!/usr/bin/env python3
"""Scale on paper (issue 27): a discrete-event simulation of the sharding driver (`moebatch shard`)
over many moebatchd hosts, with host losses; Python's standard library only.

The host: what moebatch-plan (the MoE-Lens performance model, engine/plan/) predicts for the model
on the GPU, run here as a subprocess and parsed:
  - R, the generated tokens/s of a host that never runs short of requests: Stage 2's T (eq. 14)
    for --batch 10^9 (the fill and drain of one batch vanish at that size);
  - C, the sequences one pass decodes at once: "decoding (eq. 9) g q" (capped by the daemon's
    --max_in_flight);
  - R1, Stage 2's T for one host given its share (--batch requests/hosts), for reference.
Every pass streams all the weights, whatever its batch, so a pass takes C/R seconds and advances
each sequence in it by one token. A host is therefore C slots in first-come-first-served order
(moebatchd runs one tenant's jobs in order); a request holds a slot for S = C * g / R seconds
(g generated tokens; prefill is folded into R). A host with fewer than C requests runs the same
passes with empty slots, which is what a short queue and the tail cost.

The driver: splits the batch into shards of --shard-requests requests (as moebatch.shard.split_file
does), keeps --in-flight shards submitted to each host (the next one is sent when one is
collected; at the start and after a loss, shards go one at a time to the host with the fewest),
notices a finished shard at its host's next poll (every --poll-s, a random phase per
host), fetches its results, then submits the next pending shard; each transfer takes
--shard-overhead-s plus --request-overhead-s per request. Merging results costs the driver's one
process --driver-cpu-per-shard-s plus --driver-cpu-per-request-s per request (its busy fraction
is reported). Lost hosts: --losses hosts, drawn at random, are lost for good at random times in
the first 90% of the ideal makespan; everything not yet collected from them (queued, running,
finished but not fetched) goes back to the front of the pending queue --detect-s seconds later.
Options: hosts of unequal speed (--host-spread: each 1 + uniform(-spread, spread)), and end-game
copies (--end-game-copies: once nothing is pending, a host with room runs a copy of the shard that
would be collected last, when the copy would be collected sooner; the first result is kept, the
other copy cancelled, its slots staying booked in the model).

Reported: the makespan, the total throughput against --hosts times one host (the same host model
given its share as one job: no shards, no polling, no losses; scaled by each host's speed),
against the host time the lost hosts left, and against --hosts times R1 (the plan's own figure
for one host), the cost of the losses (the same run without losses; the work
done on lost hosts and thrown away), and the driver's accounting (every request collected exactly
once). --sweep prints that ratio for a grid of shard sizes and in-flight counts.

    python3 bench/scale_out_sim.py [--hosts 100 --requests 10000000 --losses 5 ...]
                                   [--sweep [--seeds N]] [--json]
moebatch-plan comes from --plan (default $MOEBATCH_BUILD_DIR/engine/moebatch-plan, else
build/engine/moebatch-plan); --rate and --slots give R and C directly instead.
"""
from __future__ import annotations

import argparse
import collections
import copy
import dataclasses
import heapq
import json
import math
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STREAM_BATCH = 10**9  # moebatch-plan --batch for the rate of a host that never runs short


# -- the host model, from moebatch-plan -----------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class HostModel:
    rate: float        # R: generated tokens/s with every slot busy
    slots: int         # C: sequences decoded at once
    gen_tokens: int    # g: generated tokens per request
    plan_share_rate: float | None = None  # R1: the plan's T for one host's share (reference)
    plan_command: str = ""

    @property
    def service_s(self) -> float:
        """S: the seconds a request holds its slot."""
        return self.slots * self.gen_tokens / self.rate


def default_plan() -> Path:
    build = Path(os.environ.get("MOEBATCH_BUILD_DIR", ROOT / "build"))
    return build / "engine" / "moebatch-plan"


def plan_command(plan: Path, preset: str, gpu: str, prompt: int, gen: int, kv_gb: float,
                 batch: int) -> list[str]:
    return [str(plan), "--preset", preset, "--gpu", gpu, "--prompt_tokens", str(prompt),
            "--gen_tokens", str(gen), "--kv_cache_gb", f"{kv_gb:g}", "--batch", str(batch)]


def run_plan(command: list[str]) -> tuple[float, int]:
    """(T of eq. 14 in generated tokens/s, g q of eq. 9) from moebatch-plan's output."""
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=60).stdout
    rate = re.search(r"^\s*T \(eq\. 14\)\s+([\d.]+) generated tokens/s", out, re.M)
    slots = re.search(r"^\s*decoding \(eq\. 9\)\s+g q = (\d+) sequences", out, re.M)
    if not rate or not slots:
        raise RuntimeError(f"{' '.join(command)}: unexpected output:\n{out}")
    return float(rate.group(1)), int(slots.group(1))


def host_model_from_plan(plan: Path, preset: str, gpu: str, prompt: int, gen: int, kv_gb: float,
                         share: int, max_in_flight: int) -> HostModel:
    stream = plan_command(plan, preset, gpu, prompt, gen, kv_gb, STREAM_BATCH)
    rate, slots = run_plan(stream)
    share_rate, _ = run_plan(plan_command(plan, preset, gpu, prompt, gen, kv_gb, share))
    return HostModel(rate=rate, slots=min(slots, max_in_flight), gen_tokens=gen,
                     plan_share_rate=share_rate,
                     plan_command=" ".join(["moebatch-plan"] + stream[1:]))


# -- the simulation -----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Config:
    hosts: int = 100
    requests: int = 10_000_000
    shard_requests: int = 2000
    in_flight: int = 3
    poll_s: float = 5.0
    shard_overhead_s: float = 0.2
    request_overhead_s: float = 2e-5
    driver_cpu_per_shard_s: float = 0.005
    driver_cpu_per_request_s: float = 2e-5
    losses: int = 5
    detect_s: float = 60.0
    host_spread: float = 0.0   # each host's speed: 1 + uniform(-spread, spread)
    end_game_copies: bool = False  # with nothing pending, copy the shards that would end last
    seed: int = 1


class Host:
    """C slots served first come, first served: `free` holds [time a slot frees, slots] runs in
    time order; a shard's requests take the earliest slots, starting no earlier than it arrives."""

    def __init__(self, index: int, slots: int, poll_phase: float, speed: float):
        self.index = index
        self.free = collections.deque([[0.0, slots]])
        self.poll_phase = poll_phase
        self.speed = speed                   # its rate / R: its requests hold a slot S / speed
        self.lost_at = math.inf
        self.assigned: dict[int, int] = {}   # shard -> attempt, submitted and not collected

    def slot_s(self, service_s: float) -> float:
        return service_s / self.speed

    def run(self, arrival: float, n: int, service_s: float,
            free: collections.deque | None = None) -> list[tuple[float, int]]:
        """Schedules n requests arriving at `arrival` on `free` (default: this host's): their
        (start, count) runs."""
        free = self.free if free is None else free
        service_s = self.slot_s(service_s)
        runs = []
        while n:
            slot = free[0]
            take = min(slot[1], n)
            start = max(arrival, slot[0])
            if take == slot[1]:
                free.popleft()
            else:
                slot[1] -= take
            end = start + service_s
            if free and free[-1][0] == end:
                free[-1][1] += take
            else:
                free.append([end, take])
            if runs and runs[-1][0] == start:
                runs[-1] = (start, runs[-1][1] + take)
            else:
                runs.append((start, take))
            n -= take
        return runs

    def finish_if(self, arrival: float, n: int, service_s: float) -> float:
        """When n requests arriving at `arrival` would end, leaving the schedule as it is."""
        runs = self.run(arrival, n, service_s, copy.deepcopy(self.free))
        return runs[-1][0] + self.slot_s(service_s)


def simulate(cfg: Config, model: HostModel) -> dict:
    """One run; deterministic for a given cfg.seed. Returns its figures and the accounting."""
    if cfg.hosts < 1 or cfg.requests < 1 or cfg.shard_requests < 1 or cfg.in_flight < 1:
        raise ValueError("hosts, requests, shard_requests and in_flight must be at least 1")
    if cfg.losses >= cfg.hosts:
        raise ValueError("losses must leave at least one host")
    if not 0 <= cfg.host_spread < 1:
        raise ValueError("host_spread must be in [0, 1)")
    rng = random.Random(cfg.seed)
    service = model.service_s
    sizes = [cfg.shard_requests] * (cfg.requests // cfg.shard_requests)
    if cfg.requests % cfg.shard_requests:
        sizes.append(cfg.requests % cfg.shard_requests)
    collected = [0] * len(sizes)       # times each shard's results were taken: must end at 1
    collected_on: dict[int, int] = {}  # shard -> the host its results came from
    attempts = [0] * len(sizes)        # times each shard was submitted
    # shard -> {host: (attempt, its requests' (start, count) runs, or None before it arrives)}
    live: dict[int, dict[int, tuple[int, list | None]]] = collections.defaultdict(dict)
    pending = collections.deque(range(len(sizes)))
    phases = [rng.uniform(0, cfg.poll_s) for _ in range(cfg.hosts)]
    speeds = [1 + rng.uniform(-cfg.host_spread, cfg.host_spread) for _ in range(cfg.hosts)]
    hosts = [Host(i, model.slots, phases[i], speeds[i]) for i in range(cfg.hosts)]
    ideal_s = cfg.requests * model.gen_tokens / (cfg.hosts * model.rate)
    for index in rng.sample(range(cfg.hosts), cfg.losses):
        hosts[index].lost_at = rng.uniform(0, 0.9 * ideal_s)

    events: list = []
    sequence = 0
    wasted_slot_s = 0.0        # slot-seconds spent on requests whose results were not used
    copies = 0                 # end-game copies submitted
    copies_won = 0             # shards whose results came from the copy

    def push(t: float, kind: str, *payload) -> None:
        nonlocal sequence
        heapq.heappush(events, (t, sequence, kind, payload))
        sequence += 1

    def transfer_s(shard: int) -> float:
        return cfg.shard_overhead_s + cfg.request_overhead_s * sizes[shard]

    def seen_at(host: Host, finish: float) -> float:
        """The host's first poll at or after `finish`."""
        if cfg.poll_s <= 0:
            return finish
        return host.poll_phase + max(math.ceil((finish - host.poll_phase) / cfg.poll_s), 0) * \
            cfg.poll_s

    def submit(host: Host, shard: int, t: float) -> None:
        attempts[shard] += 1
        host.assigned[shard] = attempts[shard]
        live[shard][host.index] = (attempts[shard], None)
        push(t + transfer_s(shard), "arrive", host.index, shard, attempts[shard])

    def drop(host: Host, shard: int, until: float) -> None:
        """Forgets `host`'s attempt at `shard`; its requests' slot time up to `until` is wasted."""
        nonlocal wasted_slot_s
        del host.assigned[shard]
        _, runs = live[shard].pop(host.index)
        for start, count in runs or []:
            wasted_slot_s += count * min(max(until - start, 0.0), host.slot_s(service))

    def end_game_copy(host: Host, t: float) -> bool:
        """With nothing pending, a copy on `host` of the shard (run once so far, elsewhere) that
        would otherwise be collected last, if the copy would be collected sooner."""
        best, best_done = None, -math.inf
        for shard, where in live.items():
            if collected[shard] or len(where) != 1 or host.index in where:
                continue
            (other, (_, runs)), = where.items()
            if runs is None:
                continue
            done = seen_at(hosts[other], runs[-1][0] + hosts[other].slot_s(service)) + \
                transfer_s(shard)
            if done > best_done:
                best, best_done = shard, done
        if best is None:
            return False
        arrival = t + transfer_s(best)
        if seen_at(host, host.finish_if(arrival, sizes[best], service)) + transfer_s(best) \
                >= best_done:
            return False
        submit(host, best, t)
        return True

    def fill(host: Host, t: float) -> None:
        """Submits pending shards to `host` until it has cfg.in_flight; then end-game copies."""
        nonlocal copies
        while t < host.lost_at and len(host.assigned) < cfg.in_flight and pending:
            submit(host, pending.popleft(), t)
        while (cfg.end_game_copies and t < host.lost_at and not pending and
               len(host.assigned) < cfg.in_flight and end_game_copy(host, t)):
            copies += 1

    def fill_all(t: float) -> None:
        """Submits pending shards one at a time to the alive host with the fewest in flight
        (the lowest index first among equals) until every host has cfg.in_flight: at the start
        and when a lost host's shards come back, work spreads over all hosts."""
        while pending:
            open_hosts = [h for h in hosts if t < h.lost_at and len(h.assigned) < cfg.in_flight]
            if not open_hosts:
                return
            for host in sorted(open_hosts, key=lambda h: (len(h.assigned), h.index)):
                if not pending or len(host.assigned) >= cfg.in_flight:
                    break
                submit(host, pending.popleft(), t)

    for host in hosts:
        if host.lost_at < math.inf:
            push(host.lost_at + cfg.detect_s, "detect", host.index)
    fill_all(0.0)

    driver_free = 0.0          # when the driver's process has merged everything collected
    driver_busy_s = 0.0
    lost_submissions = 0
    last_collect = 0.0
    first_idle = math.inf      # the first time an alive host has nothing left to run
    while events:
        t, _, kind, payload = heapq.heappop(events)
        if kind == "arrive":
            index, shard, attempt = payload
            host = hosts[index]
            if host.assigned.get(shard) != attempt or t >= host.lost_at:
                continue  # cancelled, or the host is gone (detection puts the shard back)
            runs = host.run(t, sizes[shard], service)
            live[shard][index] = (attempt, runs)
            finish = seen_at(host, runs[-1][0] + host.slot_s(service))
            push(finish + transfer_s(shard), "collect", index, shard, attempt)
        elif kind == "collect":
            index, shard, attempt = payload
            host = hosts[index]
            if host.assigned.get(shard) != attempt or t >= host.lost_at:
                continue
            del host.assigned[shard]
            live[shard].pop(index)
            collected[shard] += 1
            collected_on[shard] = index
            if attempt > 1 and live[shard]:
                copies_won += 1
            # The other copy, if any, is cancelled: its host takes other work.
            for other in list(live[shard]):
                drop(hosts[other], shard, t)
                fill(hosts[other], t)
            del live[shard]
            last_collect = t
            cost = cfg.driver_cpu_per_shard_s + cfg.driver_cpu_per_request_s * sizes[shard]
            driver_free = max(driver_free, t) + cost
            driver_busy_s += cost
            fill(host, t)
            if not host.assigned and not pending:
                first_idle = min(first_idle, t)
        elif kind == "detect":
            (index,) = payload
            host = hosts[index]
            # Back to the front, in their original order (the oldest work first), unless a copy
            # runs elsewhere.
            for shard in sorted(host.assigned, reverse=True):
                if live[shard][index][1] is None:
                    lost_submissions += 1
                drop(host, shard, host.lost_at)
                if not live[shard]:
                    pending.appendleft(shard)
            fill_all(t)
            for other in hosts:
                fill(other, t)

    makespan = max(last_collect, driver_free)
    done = sum(size for size, count in zip(sizes, collected) if count == 1)
    # Slot-seconds of the requests collected: each ran once, on the host that returned it.
    busy_slot_s = sum(sizes[shard] * hosts[h].slot_s(service) for shard, h in collected_on.items())
    busy_slot_s += wasted_slot_s
    alive_host_s = sum(min(h.lost_at, makespan) for h in hosts)
    # Host time in units of a speed-1 host: what hosts x one host means with unequal hosts.
    capacity_host_s = sum(min(h.lost_at, makespan) * h.speed for h in hosts)
    return {
        "config": dataclasses.asdict(cfg),
        "shards": len(sizes),
        "makespan_s": makespan,
        "ideal_makespan_s": ideal_s,
        "throughput_tokens_s": cfg.requests * model.gen_tokens / makespan,
        "requests_collected": done,
        "exactly_once": all(count == 1 for count in collected),
        "resubmitted_shards": sum(attempts) - len(sizes) - copies,
        "end_game_copies": copies,
        "end_game_copies_won": copies_won,
        "lost_submissions": lost_submissions,
        "wasted_host_s": wasted_slot_s / model.slots,
        "alive_host_s": alive_host_s,
        "capacity_host_s": capacity_host_s,
        "speed_sum": sum(speeds),
        "slot_utilization": busy_slot_s / (alive_host_s * model.slots),
        "end_game_s": makespan - min(first_idle, makespan),
        "driver_busy_fraction": driver_busy_s / makespan,
    }


def one_host(cfg: Config, model: HostModel) -> dict:
    """One host given its share (requests / hosts) as one job: no shards, polls, transfers or
    losses; the '1x' of the comparison."""
    share = math.ceil(cfg.requests / cfg.hosts)
    return simulate(Config(hosts=1, requests=share, shard_requests=share, in_flight=1, poll_s=0,
                           shard_overhead_s=0, request_overhead_s=0, driver_cpu_per_shard_s=0,
                           driver_cpu_per_request_s=0, losses=0, seed=cfg.seed), model)


def evaluate(cfg: Config, model: HostModel) -> dict:
    """The run, the same run without losses, and the comparison with hosts x one host."""
    run = simulate(cfg, model)
    single = one_host(cfg, model)
    no_loss = simulate(dataclasses.replace(cfg, losses=0), model) if cfg.losses else run
    result = dict(run)
    result["one_host_tokens_s"] = single["throughput_tokens_s"]
    # hosts x one host: each host given its share alone runs at its speed x the single's rate.
    result["ratio"] = run["throughput_tokens_s"] / (run["speed_sum"] *
                                                    single["throughput_tokens_s"])
    # Against the host time the lost hosts left: their missing time is no driver's doing.
    result["ratio_surviving"] = run["throughput_tokens_s"] / (
        run["capacity_host_s"] / run["makespan_s"] * single["throughput_tokens_s"])
    if model.plan_share_rate:
        result["ratio_vs_plan_share"] = run["throughput_tokens_s"] / (
            cfg.hosts * model.plan_share_rate)
    result["no_loss_makespan_s"] = no_loss["makespan_s"]
    result["no_loss_ratio"] = no_loss["throughput_tokens_s"] / (
        no_loss["speed_sum"] * single["throughput_tokens_s"])
    result["loss_cost_s"] = run["makespan_s"] - no_loss["makespan_s"]
    return result


# -- the command line ---------------------------------------------------------------------------

def hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h"


def report(result: dict, model: HostModel) -> str:
    cfg = result["config"]
    lines = [
        f"host model   R {model.rate:.1f} generated tokens/s with {model.slots} sequences per "
        f"pass; a request holds its slot {model.service_s:.0f} s",
        f"workload     {cfg['requests']:,} requests x {model.gen_tokens} generated tokens on "
        f"{cfg['hosts']} hosts; shards of {cfg['shard_requests']:,} ({result['shards']:,}), "
        f"{cfg['in_flight']} in flight per host, poll every {cfg['poll_s']:g} s",
        f"losses       {cfg['losses']} hosts, detected after {cfg['detect_s']:g} s; "
        f"{result['resubmitted_shards']} shards resubmitted, "
        f"{result['wasted_host_s'] / 3600:.2f} host-hours of work thrown away",
        f"makespan     {hours(result['makespan_s'])} (ideal {hours(result['ideal_makespan_s'])}, "
        f"without the losses {hours(result['no_loss_makespan_s'])}: the losses cost "
        f"{result['loss_cost_s'] / 60:.1f} min)",
        f"throughput   {result['throughput_tokens_s']:,.0f} generated tokens/s = "
        f"{result['ratio']:.4f} x {cfg['hosts']} x one host "
        f"({result['one_host_tokens_s']:.1f} tokens/s given its share as one job); "
        f"without the losses {result['no_loss_ratio']:.4f}",
        f"             = {result['ratio_surviving']:.4f} x the host time the lost hosts left "
        f"({result['capacity_host_s'] / 3600:,.1f} host-hours at speed 1)",
    ]
    if "ratio_vs_plan_share" in result:
        lines.append(f"             = {result['ratio_vs_plan_share']:.4f} x {cfg['hosts']} x "
                     f"moebatch-plan's {model.plan_share_rate:.1f} tokens/s for one host's share")
    lines.append(
        f"accounting   {result['requests_collected']:,} of {cfg['requests']:,} requests "
        f"collected, every shard exactly once: {result['exactly_once']}; slots busy "
        f"{result['slot_utilization']:.1%}, end game {result['end_game_s'] / 60:.1f} min, "
        f"driver busy {result['driver_busy_fraction']:.2%}")
    return "\n".join(lines)


SWEEP_SHARDS = [250, 1000, 2000, 5000, 20000, 100000]
SWEEP_IN_FLIGHT = [1, 2, 3, 4, 8]


def main(argv: list[str] | None = None) -> int:
    defaults = Config()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--hosts", type=int, default=defaults.hosts)
    p.add_argument("--requests", type=int, default=defaults.requests)
    p.add_argument("--shard-requests", type=int, default=defaults.shard_requests)
    p.add_argument("--in-flight", type=int, default=defaults.in_flight,
                   help="shards submitted to each host and not yet collected")
    p.add_argument("--poll-s", type=float, default=defaults.poll_s,
                   help="the driver's poll interval per host (0: told at once)")
    p.add_argument("--shard-overhead-s", type=float, default=defaults.shard_overhead_s,
                   help="each submission and each fetch of a shard")
    p.add_argument("--request-overhead-s", type=float, default=defaults.request_overhead_s,
                   help="each submission and each fetch, per request")
    p.add_argument("--driver-cpu-per-shard-s", type=float,
                   default=defaults.driver_cpu_per_shard_s)
    p.add_argument("--driver-cpu-per-request-s", type=float,
                   default=defaults.driver_cpu_per_request_s)
    p.add_argument("--losses", type=int, default=defaults.losses)
    p.add_argument("--detect-s", type=float, default=defaults.detect_s,
                   help="from a host's loss until the driver moves its shards")
    p.add_argument("--host-spread", type=float, default=defaults.host_spread,
                   help="hosts' speeds differ: 1 + uniform(-SPREAD, SPREAD) each")
    p.add_argument("--end-game-copies", action="store_true",
                   help="once nothing is pending, a host with room runs a copy of the shard that "
                        "would be collected last (if the copy would be sooner); the first result "
                        "is kept, the other copy cancelled")
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--plan", type=Path, default=default_plan(), help="the moebatch-plan binary")
    p.add_argument("--preset", default="mixtral-8x7b")
    p.add_argument("--gpu", default="t4")
    p.add_argument("--prompt-tokens", type=int, default=98, help="p (MTBench's, as the plan's)")
    p.add_argument("--gen-tokens", type=int, default=128, help="g (MTBench's, as the plan's)")
    p.add_argument("--kv-cache-gb", type=float, default=70.0, help="each host's KV cache, GiB")
    p.add_argument("--max-in-flight", type=int, default=8192,
                   help="the daemons' --max_in_flight (deploy/k8s's configuration)")
    p.add_argument("--rate", type=float, help="R instead of moebatch-plan's")
    p.add_argument("--slots", type=int, help="C instead of moebatch-plan's")
    p.add_argument("--sweep", action="store_true",
                   help="the ratio for shard sizes x in-flight counts")
    p.add_argument("--seeds", type=int, default=1,
                   help="--sweep: runs per cell (seeds seed .. seed+N-1): the mean and the worst")
    p.add_argument("--json", action="store_true", help="the figures as JSON")
    args = p.parse_args(argv)

    cfg = Config(hosts=args.hosts, requests=args.requests, shard_requests=args.shard_requests,
                 in_flight=args.in_flight, poll_s=args.poll_s,
                 shard_overhead_s=args.shard_overhead_s,
                 request_overhead_s=args.request_overhead_s,
                 driver_cpu_per_shard_s=args.driver_cpu_per_shard_s,
                 driver_cpu_per_request_s=args.driver_cpu_per_request_s, losses=args.losses,
                 detect_s=args.detect_s, host_spread=args.host_spread,
                 end_game_copies=args.end_game_copies, seed=args.seed)
    if args.rate is not None and args.slots is not None:
        model = HostModel(rate=args.rate, slots=min(args.slots, args.max_in_flight),
                          gen_tokens=args.gen_tokens)
    else:
        model = host_model_from_plan(args.plan, args.preset, args.gpu, args.prompt_tokens,
                                     args.gen_tokens, args.kv_cache_gb,
                                     math.ceil(args.requests / args.hosts), args.max_in_flight)
    started = time.monotonic()
    if not args.sweep:
        result = evaluate(cfg, model)
        result["plan_command"] = model.plan_command
        result["sim_seconds"] = time.monotonic() - started
        print(json.dumps(result, indent=1) if args.json else report(result, model))
        return 0 if result["exactly_once"] else 1
    rows = []
    for shard in SWEEP_SHARDS:
        for in_flight in SWEEP_IN_FLIGHT:
            runs = [evaluate(dataclasses.replace(cfg, shard_requests=shard, in_flight=in_flight,
                                                 seed=cfg.seed + i), model)
                    for i in range(args.seeds)]
            if not all(r["exactly_once"] for r in runs):
                print(f"accounting broken at shard {shard}, in flight {in_flight}",
                      file=sys.stderr)
                return 1
            rows.append({"shard_requests": shard, "in_flight": in_flight,
                         "ratio_mean": sum(r["ratio"] for r in runs) / len(runs),
                         "ratio_min": min(r["ratio"] for r in runs),
                         "ratio_surviving_min": min(r["ratio_surviving"] for r in runs),
                         "no_loss_ratio": runs[0]["no_loss_ratio"]})
    if args.json:
        print(json.dumps({"plan_command": model.plan_command, "rate": model.rate,
                          "slots": model.slots, "seeds": args.seeds, "rows": rows}, indent=1))
        return 0
    print(f"host model: R {model.rate:.1f} generated tokens/s, {model.slots} sequences per pass "
          f"({model.plan_command or 'given'}); {cfg.hosts} hosts, {cfg.requests:,} requests, "
          f"{cfg.losses} lost, poll {cfg.poll_s:g} s, "
          f"seeds {cfg.seed}..{cfg.seed + args.seeds - 1}")
    print("each cell: throughput / (hosts x one host given its share) with the losses, mean and "
          "worst over the seeds / the worst against the surviving host time / without losses")
    print(f"{'shard':>7} " + " ".join(f"{f'in flight {k}':>27}" for k in SWEEP_IN_FLIGHT))
    for shard in SWEEP_SHARDS:
        cells = [r for r in rows if r["shard_requests"] == shard]
        print(f"{shard:>7} " + " ".join(
            f"{r['ratio_mean']:>6.3f} {r['ratio_min']:.3f} / {r['ratio_surviving_min']:.3f} / "
            f"{r['no_loss_ratio']:.3f}" for r in cells))
    print(f"({time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
