"""Many live sessions on one GPU: scenarios x scheduling policies, side by side in one process.

The serving path as ``dreamrt serve --compile`` runs it, minus the network: one loaded (and on
CUDA compiled) instance, warmed up once per profile; for every (scenario, scheduler) a fresh
``Engine`` with ``make_scheduler(name)`` and a ``Profiler`` calibrating one shared cost model (a
warm pass after the compiling warm-up calibrates it first, so no policy starts on priors);
sessions' ``chunk_rollout`` loops spawned with ``Priority.REALTIME`` on their slab of the
preallocated K/V buffer, with ``media_t0_s`` (the engine's playout deadlines); frames reach the
host as uint8 (the engine
resolves a decode's ``PendingOutput`` off the event loop) and a simulated viewer per session
(``infra.bench.sim_viewer``) plays them out at the profile fps, moving the loop's deadline
anchor as a session does.

Scenarios (``--scenarios``; the card's default profile unless said):

- ``n1``, ``n2``, ``n3``: N sessions from t = 0.
- ``n2job``: N = 2 plus one T2V job (``JobRequest(task="t2v", num_frames=21)``, batch class,
  the card's ``loop_for("text_to_video")``); its completion time against the job alone.
- ``n2switch``: N = 2, session 0 switches prompt every ``--switch-every`` seconds.
- ``small``: ``--small-profile`` (480x272@16), the sessions admitted by an
  ``AdmissionController`` as ``sessions.host`` builds the request once its cost model is
  calibrated (compute share = the measured GPU-seconds of a steady chunk, the decode's
  second-stream time included, / chunk seconds; a slab of the profile's pool; peak bytes):
  N = the admission limit, started one every ``--ramp`` seconds. Then ``small+1`` (policies in
  ``--refusal-schedulers``): the same, and after the ramp one more is asked for; it must be
  refused (``Reject`` with ``retry_after_s``), and the admitted sessions' numbers are compared
  with the ``small`` run. The limit from the analytic prior (what an uncalibrated server
  admits) is reported beside it; ``--admit-from prior`` admits from that instead.
- any of these with ``+batch`` (e.g. ``n3+batch``, ``small+batch``): the same with cross-session
  batching on (``WanInstance.batch_sessions``), under ``--batch-schedulers`` (step-edf); a
  batched warm-up compiles the batched forward first.

The interleave gate: ``s0`` of every run has the same prompt and seed, so its chunks before its
first input applies are compared with ``s0`` of the first ``n1`` run
(``infra.bench.multisession_gate``): bit-identical unbatched, within a tolerance batched.

Every session gets one prompt switch (at 35 % of the run) and, where the card takes actions,
one action (60 %); inputs go through ``LoopHandle.push_input`` and are timed until the first
media of the chunk their ``applied`` acknowledgement names. Each run lasts ``--seconds`` after
its last session started. Per run: the measured cost per plan kind; after every run the JSON
(``--json``) and the cost snapshot (``--cost-snapshot``) are rewritten, so a timeout keeps
what finished. The table comes last.

    python -m infra.bench.multisession [--device cpu --model wan-tiny-random] [--seconds 12]
        [--scenarios n1,n2,n3,n2job,n2switch,small] [--schedulers step-edf,chunk-rr,fifo]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import time

import torch

from infra.bench.multisession_admission import admission_limit, measured_share
from infra.bench.multisession_report import compare_refusal, format_table
from infra.bench.multisession_run import run_scenario
from infra.bench.multisession_setup import (
    JOB_FRAMES,
    SCENARIOS,
    Bench,
    job_alone,
    main_profile,
    parse_profile,
    profile_key,
    scenarios,
    warm_up,
    warm_up_batched,
)
from models.instance import load_instance
from models.registry import get
from runtime.cost import CostModel, DeviceConstants
from runtime.policies import SCHEDULER_POLICIES, make_scheduler


async def _bench(
    bench: Bench, names: list[str], schedulers: list[str], batch_schedulers: list[str]
) -> None:
    inst, args = bench.instance, bench.args
    default = main_profile(bench)
    bases = [n.partition("+")[0] for n in names]
    sizes = [1] + [int(n[1]) for n in bases if n[:1] == "n" and n[1:2].isdigit()]
    inst.reserve_kv_slabs(default, max(sizes))  # one buffer per geometry: sized once, here
    profiles = [default]
    if "small" in bases:
        w, h, fps = parse_profile(args.small_profile)
        small = inst.card.resolve_profile(width=w, height=h, fps=fps)
        inst.reserve_kv_slabs(small, args.small_max)
        profiles.append(small)
    for profile in profiles:
        bench.chunk_seconds[profile_key(profile)] = inst.chunk_seconds(profile)
        # compile on a throwaway cost model, then calibrate the bench's on a warm pass
        seconds = await warm_up(bench, profile, CostModel(bench.cost.device))
        calibrate_s = await warm_up(bench, profile, bench.cost)
        print(
            f"warm-up {profile_key(profile)}: {seconds:.1f} s, "
            f"calibration pass {calibrate_s:.1f} s",
            flush=True,
        )
        batched = [n for n in names if n.endswith("+batch")]
        if any((n.startswith("small") == (profile is not default)) for n in batched):
            n = min(max(sizes) if profile is default else args.small_max, args.max_batch)
            seconds = await warm_up_batched(bench, profile, CostModel(bench.cost.device), n)
            print(f"batched warm-up {profile_key(profile)} ({n}): {seconds:.1f} s", flush=True)
    small_limit = 0
    if "small" in bases:  # the measured costs (as the server admits) and the prior
        measured = measured_share(inst, bench.cost, small)
        if args.admit_from == "measured" and measured is None:
            raise SystemExit("multisession: no measured costs of the small profile to admit from")
        bench.admit_share = measured if args.admit_from == "measured" else None
        limit = admission_limit(
            inst,
            bench.cost,
            small,
            slabs=args.small_max,
            max_batch=args.max_batch,
            share=bench.admit_share,
        )
        small_limit = limit["limit"]
        limit.update(admit_from=args.admit_from, share_measured=measured)
        bench.extra["small_admission"] = limit
        print(
            f"small {profile_key(small)}: admission ({args.admit_from}) limit {small_limit}, next "
            f"refused for {limit['reject_reason']}; share per session: prior "
            f"{limit['share_prior']:.3f}, measured {measured} GPU-s/s (capacity "
            f"{limit['capacity']})",
            flush=True,
        )
    if "n2job" in bases:
        bench.job_alone_s = await job_alone(bench, default)
        print(f"t2v job alone ({JOB_FRAMES} frames): {bench.job_alone_s:.2f} s", flush=True)
    for scenario in scenarios(bench, names, small_limit):
        policies_of = batch_schedulers if scenario.batch else schedulers
        variants = [(scenario, policies_of)]
        if scenario.admitted and not scenario.batch:
            refusal = [s for s in args.refusal_schedulers.split(",") if s in policies_of]
            variants.append((dataclasses.replace(scenario, one_more=True), refusal))
        for variant, policies in variants:
            for scheduler in policies:
                bench.runs.append(await run_scenario(bench, variant, scheduler))
                bench.write()
    for line in compare_refusal(bench.runs):
        print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument(
        "--model",
        default=None,
        help="card (default: wan2.1-1.3b-causal on cuda, wan-tiny-random on cpu)",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="per run after its last session started (default 12 cuda, 3 cpu)",
    )
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument(
        "--profile", default=None, help="WxH@FPS of the n* scenarios (default: the card's)"
    )
    parser.add_argument("--schedulers", default=",".join(SCHEDULER_POLICIES))
    parser.add_argument(
        "--batch-schedulers",
        default="step-edf",
        help="policies that run the +batch scenarios (cross-session batching on)",
    )
    parser.add_argument(
        "--refusal-schedulers",
        default="step-edf",
        help="policies that also run small+1 (the refused extra session)",
    )
    parser.add_argument(
        "--small-profile", default=None, help="WxH@FPS (default 480x272@16 cuda, 32x32@8 cpu)"
    )
    parser.add_argument(
        "--small-max",
        type=int,
        default=None,
        help="slabs of the small profile's pool (default 12 cuda, 4 cpu)",
    )
    parser.add_argument(
        "--admit-from",
        choices=["prior", "measured"],
        default="measured",
        help="small's compute share: measured (as sessions.host once calibrated) or the prior",
    )
    parser.add_argument("--ramp", type=float, default=0.5, help="seconds between small's starts")
    parser.add_argument("--switch-every", type=float, default=3.0)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--playout-buffer-s", type=float, default=0.25)
    parser.add_argument("--max-lead-s", type=float, default=1.0)
    parser.add_argument("--job-timeout", type=float, default=60.0)
    out = os.environ.get("OUT")
    parser.add_argument("--json", default=f"{out}/multisession.json" if out else None)
    parser.add_argument("--cost-snapshot", default=f"{out}/cost_snapshot.json" if out else None)
    args = parser.parse_args(argv)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("multisession: CUDA is not available (--device cpu for a smoke run)", file=sys.stderr)
        return 2
    args.model = args.model or ("wan2.1-1.3b-causal" if cuda else "wan-tiny-random")
    args.seconds = args.seconds if args.seconds is not None else (12.0 if cuda else 3.0)
    args.small_profile = args.small_profile or ("480x272@16" if cuda else "32x32@8")
    args.small_max = args.small_max or (12 if cuda else 4)
    schedulers = args.schedulers.split(",")
    for name in schedulers:
        make_scheduler(name)  # an unknown name fails now, naming the known ones
    card = get(args.model)
    # each K/V-prefix length and re-cache layout is a graph of the blocks' one code object
    torch._dynamo.config.cache_size_limit = 64
    torch._dynamo.config.accumulated_cache_size_limit = 512
    start = time.perf_counter()
    instance = load_instance(
        card, device=args.device, random_weights=True, precision="bf16" if cuda else "fp32"
    )
    if cuda:
        instance.compile()
    spec = card.loops["chunk_rollout"]
    bench = Bench(
        args=args,
        instance=instance,
        cost=CostModel(DeviceConstants.h200() if cuda else DeviceConstants.cpu()),
        can_act="action" in spec.inputs,
        meta={
            "card": card.model_id,
            "device": args.device,
            "device_name": torch.cuda.get_device_name() if cuda else "cpu",
            "torch": torch.__version__,
            "seconds": args.seconds,
            "max_batch": args.max_batch,
            "playout_buffer_s": args.playout_buffer_s,
            "max_lead_s": args.max_lead_s,
        },
    )
    print(
        f"{card.model_id} on {bench.meta['device_name']}: loaded in "
        f"{time.perf_counter() - start:.1f} s",
        flush=True,
    )
    batch_schedulers = args.batch_schedulers.split(",")
    asyncio.run(_bench(bench, args.scenarios.split(","), schedulers, batch_schedulers))
    bench.write()
    print(
        f"\n{card.model_id}, {bench.meta['device_name']}, {args.seconds:g} s per run, "
        f"buffer {args.playout_buffer_s} s, lead {args.max_lead_s} s; total "
        f"{time.perf_counter() - start:.0f} s"
    )
    print(format_table(bench.runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
