"""Benchmarks that print their figures as JSON (images/s, MFU, bus bandwidth, scaling).

`run_benchmark` runs the benchmark that answers a request of training/benchmarks/request.py,
importing it (and with it torch) only then, so that the command line checks its flags first.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from training.benchmarks.request import (
    BenchRequest,
    IngestBenchRequest,
    LoaderBenchRequest,
    PretrainBenchRequest,
    ProfileScaleBenchRequest,
    ScaleBenchRequest,
    ScreenBenchRequest,
)

log = logging.getLogger(__name__)


def run_benchmark(config, request: BenchRequest) -> dict[str, Any]:
    """Run the benchmark that answers `request` (importing it, and torch, only now); its JSON figures."""
    if isinstance(request, ScreenBenchRequest) and request.seeds is not None:
        from training.benchmarks.quality import screen_seeds

        result = screen_seeds.run_seeds(request.config_path, list(request.overrides), request.seeds,
                                        ranks=request.ranks, reuse=request.reuse, truth=request.truth)
        log.info("bench screen --seeds:\n%s", screen_seeds.markdown(result))
        return result
    if isinstance(request, ScreenBenchRequest):
        from training.benchmarks.quality.screen import markdown, run_screen_benchmark

        result = run_screen_benchmark(config, request.config_path, list(request.overrides), ranks=request.ranks,
                                      reuse=request.reuse, truth=request.truth)
        log.info("bench screen:\n%s", markdown(result))
        return result
    if isinstance(request, IngestBenchRequest):
        from training.benchmarks.data.ingest_rate import run_ingest_benchmark

        return run_ingest_benchmark(list(request.fields), cells=request.cells, crop=request.crop)
    if isinstance(request, ScaleBenchRequest):
        from training.benchmarks.data.scale import run_scale_benchmark

        return run_scale_benchmark(list(request.sizes))
    if isinstance(request, ProfileScaleBenchRequest):
        from training.benchmarks.data.profile_scale import run_profile_scale_benchmark

        return run_profile_scale_benchmark(list(request.sizes), plates=request.plates, steps=request.steps)
    if isinstance(request, LoaderBenchRequest):
        from training.benchmarks.data.loader import run_loader_benchmark

        return run_loader_benchmark(config, request)
    if isinstance(request, PretrainBenchRequest):
        from training.benchmarks.speed.pretrain import run_pretrain_benchmark

        return run_pretrain_benchmark(config, request)
    start = time.perf_counter()
    import training.trainer  # noqa: F401  (what `pretrain` imports: torch, timm, models, loaders)
    from training.benchmarks.speed.step import run_step_benchmark

    import_s = time.perf_counter() - start
    result = run_step_benchmark(config, request)
    result["import_s"] = round(import_s, 3)
    result["startup_s"] = round(import_s + result["build_s"], 3)
    return result
