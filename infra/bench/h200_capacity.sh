#!/usr/bin/env bash
# One device call of the capacity work on an H200: the stages named in $1 (comma list), each
# under its own timeout so one that hangs leaves the others' results; JSON and logs go to $OUT.
#
#   bash infra/bench/h200_capacity.sh engine,vae,guard        # engine-level variants
#   bash infra/bench/h200_capacity.sh server                  # sessions per GPU, real server
#   bash infra/bench/h200_capacity.sh warm                    # ready times, a job beside a
#                                                             # session, sessions per GPU
#   bash infra/bench/h200_capacity.sh compile                 # dreamrt compile: fresh, cached
#   bash infra/bench/h200_capacity.sh probe,start             # ready fresh, from the cache
#                                                             # and from a copy of it
#   bash infra/bench/h200_capacity.sh ops,vae                 # one DiT block op by op, bf16
#                                                             # against FP8; the VAE decode alone
#   bash infra/bench/h200_capacity.sh startup,serving         # dreamrt compile fresh, cached,
#                                                             # from a copy pruned to what start
#                                                             # needs; then serve from the cache:
#                                                             # sessions per GPU, time to steer
#
# The warm stage's fresh start alone takes ~400 s on the H200, so one call holds a fresh and a
# cached start and little else: WARM_PHASES=fresh,cached WARM_SETUPS= (empty: no setups)
# WARM_ARGS="--mixed-on cached --latency-on cached". Its phases can span two calls of one warm
# machine (WARM_CACHE=data/warm-cache, ignored by git, stays on the machine between calls), but
# only if the second call starts within the machine's 30-s idle window: once it did not.
#
# Wheels: the device image lacks msgspec, aiortc, av, fastapi and fa3-fwd; they travel as one
# xz tarball of their unpacked wheels (.whl/site.tar.xz, made by infra/bench/device_wheels.sh;
# carried: 64 MiB per call in all).
set -uo pipefail
stages="${1:-engine}"
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT" /tmp/site
if [ -f .whl/site.tar.xz ]; then
  tar xJf .whl/site.tar.xz -C /tmp || exit 1
  # pip compiles an installed package's bytecode; the carried wheels come without it, and a
  # start would pay that compile on every import (5.8 s of a model load, measured)
  python3 -m compileall -q -j 0 /tmp/site >/dev/null 2>&1
fi
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
PY=python3
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader
has() { [[ ",$stages," == *",$1,"* ]]; }
FULL="compiled+overlap+graphs+fa3"
BC="${BENCH_CACHE:-data/bench-cache}"  # the startup and serving stages' compile cache
if has probe; then  # does this torch precompile regions? (a later stage's numbers depend on it)
  timeout 240 $PY -m infra.bench.aot_probe 2>&1 | cut -c1-1500 | tee "$OUT/aot_probe.log"
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "aot probe failed"; exit 1; }
fi
if has check; then
  timeout 120 $PY -m pytest -q -p no:cacheprovider tests/models/test_kv_fp8.py 2>&1 | tail -4
fi
if has engine; then
  timeout "${ENGINE_S:-420}" $PY -m infra.bench.gpu_session --chunks 10 --window 12 --no-micro \
    --variants "${ENGINE_VARIANTS:-$FULL,$FULL+kvfp8,$FULL+kvfp8+fp8,$FULL+taehv,$FULL+kvfp8+taehv,$FULL+kvfp8+fp8+taehv}" \
    --reference "$FULL" --tiny-decoder models.wan.taehv.checkpoint:build_decoder \
    --budget-s "${ENGINE_BUDGET_S:-400}" --json "$OUT/gpu_session.json" >"$OUT/gpu_session.log" 2>&1
  tail -40 "$OUT/gpu_session.log"
fi
if has ops; then  # what FP8 buys per op and per step (the FP8 linears stay only for >= 10 %)
  # ~28 compiles per profile (a block's ~15-20 s each): 832x480 first, where FP8 can pay; the
  # JSON is rewritten after each profile, so a run cut short keeps the first
  timeout "${OPS_S:-420}" $PY -m infra.bench.fp8_ops --iters 20 \
    --profiles "${OPS_PROFILES:-832x480,480x272}" --json "$OUT/fp8_ops.json" \
    >"$OUT/fp8_ops.log" 2>&1
  tail -32 "$OUT/fp8_ops.log"
fi
if has vae; then
  timeout 200 $PY -m infra.bench.vae_decode --iters 10 \
    --variants compiled_cl,compiled_cl_bench --profile compiled_cl \
    --json "$OUT/vae_decode.json" >"$OUT/vae_decode.log" 2>&1
  tail -25 "$OUT/vae_decode.log"
fi
if has guard; then
  timeout "${GUARD_S:-200}" $PY -m infra.bench.quality_guard --device cuda --levers kvfp8,kvfp8+fp8 \
    --rollouts 50 --long-s 60 --json "$OUT/quality_guard.json" >"$OUT/quality_guard.log" 2>&1
  tail -15 "$OUT/quality_guard.log"
fi
if has server; then
  timeout "${SERVER_S:-540}" $PY -m infra.bench.capacity --json "$OUT/capacity.json" \
    ${CAPACITY_ARGS:-} >"$OUT/capacity.log" 2>&1
  tail -40 "$OUT/capacity.log"
fi
if has warm; then
  # servers run in sessions of their own: one left by a call cut short would hold the GPU
  pkill -INT -f -- '--compile-cache' && sleep 5
  timeout "${WARM_S:-560}" $PY -m infra.bench.warm_serving --model wan2.1-1.3b-causal \
    --device cuda --random-weights --max-sessions "${WARM_MAX_SESSIONS:-6}" --job-frames 241 \
    --setups "${WARM_SETUPS-full=832x480@16,tiny=832x480@16/tiny,small=480x272@16}" \
    --phases "${WARM_PHASES:-fresh,cached}" --empty-local-caches --keep-logs "$OUT/logs" \
    ${WARM_CACHE:+--cache "$WARM_CACHE"} ${WARM_ARGS:-} \
    --json "$OUT/warm_serving.json" >"$OUT/warm_serving.log" 2>&1
  tail -40 "$OUT/warm_serving.log"
  pkill -INT -f -- '--compile-cache' && sleep 5
fi
if has compile; then
  # `dreamrt compile` with every cache empty (a bare machine), then again from its cache with
  # the local caches emptied: the build's graphs and seconds, and a start from the cache alone
  rm -rf "/tmp/torchinductor_$(whoami)" ~/.triton/cache /tmp/bench-cache /tmp/bench-data
  for phase in fresh cached; do
    [ "$phase" = cached ] && rm -rf "/tmp/torchinductor_$(whoami)" ~/.triton/cache
    began=$SECONDS
    limit=$([ "$phase" = fresh ] && echo "${COMPILE_FRESH_S:-300}" || echo "${COMPILE_CACHED_S:-80}")
    timeout "$limit" $PY -m server compile --model wan2.1-1.3b-causal --device cuda \
      --random-weights --max-sessions 6 --compile-cache /tmp/bench-cache \
      --data-dir /tmp/bench-data >"$OUT/compile_$phase.log" 2>&1
    echo "dreamrt compile ($phase): exit $?, $((SECONDS - began)) s with the interpreter's start"
    grep -v "warm-up \[" "$OUT/compile_$phase.log" | grep -E "^\||Dynamo|cache:|graph break|compiling |warm-up done|Error" | cut -c1-300 | tail -14
  done
  du -sh /tmp/bench-cache/*/ /tmp/bench-cache/*/regions 2>/dev/null
fi
if has startup; then
  # `dreamrt compile` on a bare machine, again from its cache (local caches emptied), again
  # from a copy without the cache's inductor/ (what a GPU start needs: the size a fleet
  # copies). The cache stays in data/ (ignored by git, kept on a warm machine), so a
  # `serving` stage of the next call can start from it.
  pkill -INT -f -- '--compile-cache' && sleep 5
  PC=/tmp/pruned-cache
  rm -rf "/tmp/torchinductor_$(whoami)" ~/.triton/cache "$BC" "$PC" /tmp/*-data
  for phase in ${STARTUP_PHASES:-fresh cached pruned}; do
    rm -rf "/tmp/torchinductor_$(whoami)" ~/.triton/cache
    cache=$BC
    if [ "$phase" = pruned ]; then
      cp -r "$BC"/. "$PC"/ && rm -rf "$PC"/*/inductor  # what a GPU start needs
      cache=$PC
      du -sh "$BC"/*/ "$PC"/*/ "$BC"/*/regions 2>/dev/null
    fi
    began=$SECONDS
    limit=$([ "$phase" = fresh ] && echo "${COMPILE_FRESH_S:-260}" || echo "${COMPILE_CACHED_S:-70}")
    timeout "$limit" $PY -m server compile --model wan2.1-1.3b-causal --device cuda \
      --random-weights --max-sessions 6 --compile-cache "$cache" \
      --data-dir "/tmp/$phase-data" >"$OUT/compile_$phase.log" 2>&1
    echo "dreamrt compile ($phase): exit $?, $((SECONDS - began)) s with the interpreter's start"
    grep -v "warm-up \[" "$OUT/compile_$phase.log" | grep -E "^\||Dynamo|cache:|graph break|compiling |warm-up done|loaded wan|Error" | cut -c1-300 | tail -16
  done
fi
if has serving; then
  # `dreamrt serve` from the startup stage's cache, once per variant (default: the flags a user
  # gets, sessions' steps batched; graphs: --cuda-graphs; solo: --batch-sessions off;
  # cutsonly: --chunk-restart cuts-only, what restarts cost; noswitch: viewers that never switch
  # prompts, the control): ready, sessions per GPU at each profile while viewers switch
  # prompts, time to steer, compiles after ready
  for variant in ${SERVE_VARIANTS:-default}; do
    pkill -INT -f -- '--compile-cache' && sleep 3
    rm -rf "/tmp/torchinductor_$(whoami)" ~/.triton/cache
    extra=()
    [ "$variant" = graphs ] && extra=(--server-arg=--cuda-graphs)
    [ "$variant" = solo ] && extra=(--server-arg=--batch-sessions=off)
    [ "$variant" = cutsonly ] && extra=(--server-arg=--chunk-restart=cuts-only)
    every="${SWITCH_EVERY_S:-3.5}"
    [ "$variant" = noswitch ] && every=0
    timeout "${SERVE_S:-280}" $PY -m infra.bench.warm_serving --model wan2.1-1.3b-causal \
      --device cuda --random-weights --max-sessions "${WARM_MAX_SESSIONS:-6}" --phases cached \
      --cache "$BC" --empty-local-caches --mixed-on none --latency-on cached --prompts 4 \
      --cached-setups "${SERVE_SETUPS-full=832x480@16,tiny=832x480@16/tiny,small=480x272@16}" \
      --seconds "${SERVE_WATCH_S:-12}" --switch-every-s "$every" --trace-s "${TRACE_S:-2}" \
      --keep-logs "$OUT/logs-$variant" \
      "${extra[@]}" --json "$OUT/serve_$variant.json" >"$OUT/serve_$variant.log" 2>&1
    echo "serving ($variant): exit $?"
    tail -32 "$OUT/serve_$variant.log"
    grep -h "loaded wan\|precompiled graphs loaded\|warm-up done\|dreamrt ready\|compiles after" \
      "$OUT/logs-$variant"/*.log | cut -c1-300 | head -12
  done
  pkill -INT -f -- '--compile-cache' && sleep 2
fi
if has start; then
  # ready fresh (empty caches) and from the compile cache, with one capacity setup and the time
  # to steer on the cached server; then `dreamrt compile` from a copy of that cache at another
  # path with the local caches emptied (what another machine that copies the cache starts from)
  pkill -INT -f -- '--compile-cache' && sleep 5
  SC=/tmp/start-cache
  rm -rf "$SC" /tmp/copied-cache /tmp/copied-data
  timeout "${START_S:-470}" $PY -m infra.bench.warm_serving --model wan2.1-1.3b-causal \
    --device cuda --random-weights --max-sessions 6 --setups "" \
    --cached-setups "${START_SETUPS-full=832x480@16}" --mixed-on none \
    --latency-on "${START_LATENCY_ON-cached}" --prompts 4 --phases fresh,cached \
    --empty-local-caches --cache "$SC" --keep-logs "$OUT/logs" \
    --json "$OUT/start.json" >"$OUT/start.log" 2>&1
  tail -30 "$OUT/start.log"
  grep -h "compiling \|Dynamo:\|warm-up done\|precompiled graphs loaded\|dreamrt ready" \
    "$OUT"/logs/*.log | cut -c1-300
  du -sh "$SC"/*/ "$SC"/*/regions 2>/dev/null
  cp -r "$SC" /tmp/copied-cache
  rm -rf "/tmp/torchinductor_$(whoami)" ~/.triton/cache
  timeout "${COPIED_S:-100}" $PY -m server compile --model wan2.1-1.3b-causal --device cuda \
    --random-weights --max-sessions 6 --compile-cache /tmp/copied-cache \
    --data-dir /tmp/copied-data >"$OUT/compile_copied.log" 2>&1
  echo "dreamrt compile from the copy: exit $?"
  grep -v "warm-up \[" "$OUT/compile_copied.log" | tail -14
fi
exit 0
