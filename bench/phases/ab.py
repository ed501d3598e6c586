"""The stored-task scaling verdict: interleaved tasks/get on a big store and a small one.

Consecutive windows of one server on this machine drift by ±10–20%, more than the effect being tested,
so "big" (the bench Redis right after the fill, and its server) and "small" (a second private Redis
holding `ab_small_store` synthetic tasks cloned from the same templates, and a second identical
`mcp-celery serve` over it, no worker: tasks/get only reads) are measured in alternating short slices,
so that drift of the machine hits both sides equally.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Callable

import httpx

from bench import fill, rpc
from bench.config import say
from bench.load import percentile_ms
from bench.phases.task_server import Target
from bench.procs import CpuProbe, start_ours_server
from bench.redis_tools import BenchRedis, keys_stored
from bench.results import ABFigures
from mcp_celery.testing.processes import Process

MAX_ERRORS_PER_SIDE = 50


async def scaling_ab(t: Target, sample0: str, templates: list[fill.Template], n_big: int) -> None:
    """Start the small side, run the interleaved slices, and store the figures in `t.figures.scaling.ab`."""
    cfg, n_small = t.cfg, t.cfg.ab_small_store
    small = BenchRedis("redis-small")
    srv: Process | None = None
    try:
        small.start()
        secs = fill.fill("127.0.0.1", small.port, sample0, templates, n_small, deadline_s=60)
        small.settle()
        small_keys = keys_stored(small.client())
        srv, small_url = start_ours_server(small.url, "ours-server-small")
        say(
            f"  {t.tag} A/B: small Redis port {small.port} (pid {small.proc.pid if small.proc else '?'}), "
            f"{n_small} synthetic tasks in {secs:.1f}s ({small_keys} keys); small server pid {srv.pid}"
        )
        cpu0 = CpuProbe.sample()
        per_round, errors, first = await ab_slices(
            {"big": t.url, "small": small_url},
            {
                "big": lambda: fill.synthetic_id(sample0, random.randint(1, n_big)),
                "small": lambda: fill.synthetic_id(sample0, random.randint(1, n_small)),
            },
            cfg.ab_rounds,
            cfg.ab_slice_s,
        )
        foreign = CpuProbe.foreign(cpu0, CpuProbe.sample())
        t.results.foreign_cpu.append((f"{t.tag}.ab", foreign))
        if any(errors.values()):
            t.results.notes.append(f"{t.tag} interleaved A/B: errors {errors}, first: {first[:300]}")
        ab = ab_stats(per_round["big"], per_round["small"])
        ab.small_stored, ab.slice_s, ab.small_keys, ab.foreign_cpu_share = n_small, cfg.ab_slice_s, small_keys, foreign
        if t.figures.scaling is not None:
            t.figures.scaling.ab = ab
        say(
            f"  {t.tag} A/B {ab.rounds} rounds x {cfg.ab_slice_s:g}s: big p50 {ab.big_p50_ms:.3f}ms "
            f"(n={ab.big_samples}, rounds {min(ab.big_round_p50s_ms):.2f}-{max(ab.big_round_p50s_ms):.2f}), "
            f"small p50 {ab.small_p50_ms:.3f}ms (n={ab.small_samples}, rounds {min(ab.small_round_p50s_ms):.2f}-"
            f"{max(ab.small_round_p50s_ms):.2f}); big/small {ab.ratio:.3f} (95% CI {ab.ci_low:.3f}-"
            f"{ab.ci_high:.3f}); foreign-cpu {foreign:.0%}"
        )
    finally:
        if srv is not None:
            srv.stop()
            if srv.proc.returncode not in (0, -15, None):
                t.results.notes.append(
                    f"{t.tag} small server exit code {srv.proc.returncode}; log tail: {srv.tail(10)}"
                )
        small.stop()


async def ab_slices(
    urls: dict[str, str],
    pick: dict[str, Callable[[], str]],
    rounds: int,
    slice_s: float,
    skip: int = 3,
    expect: str = "completed",
) -> tuple[dict[str, list[list[float]]], dict[str, int], str]:
    """Interleaved c=1 tasks/get on several servers: `rounds` rounds of one `slice_s` slice per server;
    every answer must carry the status `expect`.

    The order within a round runs through every permutation in turn (A B, B A; of three servers all six), so
    that each server takes each place, and follows each other one, equally often. One
    keep-alive client per server for the whole run; the first `skip` requests of each slice are not recorded
    (the server that was idle during the other slice wakes up). One unrecorded warm-up round comes first.
    Returns per server the latencies (seconds) of each round, the error counts and the first error.
    """
    names = list(urls)
    orders = list(itertools.permutations(names))
    per_round: dict[str, list[list[float]]] = {n: [] for n in names}
    errors = dict.fromkeys(names, 0)
    first_err: list[str] = []
    clients = {n: rpc.new_client() for n in names}
    try:
        for rnd in range(-1, rounds):  # round -1: warm-up
            order = orders[rnd % len(orders)]
            for n in order:
                seconds = 2 * slice_s if rnd < 0 else slice_s
                lat = await one_slice(clients[n], urls[n], pick[n], seconds, skip, n, errors, first_err, expect)
                if rnd >= 0:
                    per_round[n].append(lat)
    finally:
        await asyncio.gather(*(c.aclose() for c in clients.values()), return_exceptions=True)
    return per_round, errors, first_err[0] if first_err else ""


async def one_slice(
    client: httpx.AsyncClient,
    url: str,
    pick: Callable[[], str],
    seconds: float,
    skip: int,
    side: str,
    errors: dict[str, int],
    first_err: list[str],
    expect: str = "completed",
) -> list[float]:
    """tasks/get back to back on one server for `seconds`; every answer must say `expect`."""
    lat: list[float] = []
    k = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        tid = pick()
        t0 = time.perf_counter()
        try:
            g = await rpc.tasks_get(client, url, tid)
            dt = time.perf_counter() - t0
            if g.get("status") != expect:
                raise rpc.RpcError(f"task {tid} is {g.get('status')!r}, not {expect}")
        except Exception as e:  # noqa: BLE001  (counted, and reported with the figure)
            errors[side] += 1
            if not first_err:
                first_err.append(f"{side}: {e!r}")
            if errors[side] > MAX_ERRORS_PER_SIDE:
                raise RuntimeError(f"interleaved A/B: too many errors, first: {first_err[0]}") from e
            continue
        k += 1
        if k > skip:
            lat.append(dt)
    return lat


def say_ab(what: str, sides: tuple[str, str], ab: ABFigures, control: ABFigures) -> None:
    """One progress line of an interleaved A/B: each side's p50 and samples, the ratio, the control's."""
    big, small = sides
    say(
        f"  {what}: {big} p50 {ab.big_p50_ms:.3f} ms (n={ab.big_samples}), {small} {ab.small_p50_ms:.3f} ms "
        f"(n={ab.small_samples}); {big}/{small} {ab.ratio:.3f} (95% CI {ab.ci_low:.3f}-{ab.ci_high:.3f}); "
        f"control {control.ratio:.3f} (95% CI {control.ci_low:.3f}-{control.ci_high:.3f})"
    )


def ab_stats(big: list[list[float]], small: list[list[float]], resamples: int = 400) -> ABFigures:
    """Pooled p50 per side (ms), their ratio, per-round p50s and a paired-round bootstrap 95% CI of the ratio."""
    rounds = [i for i in range(min(len(big), len(small))) if big[i] and small[i]]
    if not rounds:
        raise RuntimeError("interleaved A/B: no samples")
    flat_b = [x for i in rounds for x in big[i]]
    flat_s = [x for i in rounds for x in small[i]]
    p_b, p_s = percentile_ms(flat_b, 50), percentile_ms(flat_s, 50)
    rb = [percentile_ms(big[i], 50) for i in rounds]
    rs = [percentile_ms(small[i], 50) for i in rounds]
    rng = random.Random(2663)  # fixed seed: the CI is a function of the samples only
    boot = []
    for _ in range(resamples):
        pick = [rounds[rng.randrange(len(rounds))] for _ in rounds]
        pooled_big = percentile_ms([x for i in pick for x in big[i]], 50)
        boot.append(pooled_big / percentile_ms([x for i in pick for x in small[i]], 50))
    boot.sort()
    return ABFigures(
        big_p50_ms=p_b,
        small_p50_ms=p_s,
        big_samples=len(flat_b),
        small_samples=len(flat_s),
        ratio=p_b / p_s,
        ci_low=boot[int(0.025 * (len(boot) - 1))],
        ci_high=boot[int(0.975 * (len(boot) - 1))],
        big_round_p50s_ms=rb,
        small_round_p50s_ms=rs,
        round_ratios=[b / s for b, s in zip(rb, rs, strict=True)],
        rounds=len(rounds),
    )
