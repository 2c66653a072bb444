"""Sum up a folder of `scripts/gpu-bench.sh` figures: `python -m training.benchmarks.speed.gpu_summary DIR`.

Reads whatever the script left in DIR (a stage that failed or was cut short leaves no file, and is
listed in stages.txt) and writes DIR/summary.json:
- step: images/s, MFU, step time and its split, peak memory, precision, batch and torch version of
  each `bench step` setting;
- speedup_vs_dino_reference: the faster of ViT-S/16 eager and compiled over the same model stepped
  as facebookresearch/dino's main_dino.py steps it (`bench step --dino-reference`), same batch;
- pretrain: each `bench pretrain` setting's loop and free-running step (images/s, MFU), their ratio
  and its loader; loop_speedup_vs_dino_reference: the fastest ViT-S/16 loop (eager, compiled, CUDA
  graphs) over the reference step, the ratio `pretrain` itself achieves;
- loader: each `bench loader` size's rates, and what the device-side multi-crop would deliver with
  the CPU share one GPU gets on a p5 (LOADER_VCPUS_PER_GPU vCPUs, at its measured CPU time per image,
  one vCPU taken as one of this machine's cores), over what the fastest step or loop at those crops
  consumes;
- scaling: DIR/scaling_vits16_224.json, the multi-node model (training/benchmarks/speed/scaling.py) fed the
  faster ViT-S/16 step;
- chain: the demo's chain on this machine (kNN top-1 and epochs), when it ran.
Prints one line per figure.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from training.costs.instances import instance

LOADER_VCPUS_PER_GPU = instance("p5.48xlarge").cpus_per_gpu
"""A p5.48xlarge's vCPUs per GPU (192 vCPUs, 8 H100s), from the instance table."""

STEP_KEYS = ("images_per_s", "mfu", "achieved_tflops", "step_time_s", "split_step_time_s", "peak_memory_gb",
             "precision", "batch_size", "compiled", "style", "torch")

VITS16 = ("vits16_224", "vits16_224_compiled")
"""ViT-S/16 at scDINO's crops, eager and compiled: what the reference ratio and the scaling model take."""

VITS16_LOOPS = ("vits16_224", "vits16_224_compiled", "vits16_224_graphs")
"""`bench pretrain`'s ViT-S/16 settings at scDINO's crops: eager, compiled, compiled with CUDA graphs."""

# Which steps and loops consume which loader size: the loader's crops are theirs.
LOADER_CONSUMERS = {"224": VITS16_LOOPS, "native": ("vits8_native", "vits8_native_compiled", "vits8_native_graphs")}


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def summarise(out: Path) -> dict:
    summary: dict = {"device": _read(out / "device.json") or {}, "step": {}, "pretrain": {}, "loader": {}}
    for path in sorted(out.glob("step_*.json")):
        step = _read(path)
        if step:
            summary["step"][path.stem[5:]] = {key: step.get(key) for key in STEP_KEYS}
    for path in sorted(out.glob("pretrain_*.json")):
        pretrain = _read(path)
        if pretrain:
            summary["pretrain"][path.stem[9:]] = _pretrain_figures(pretrain)
    steps, loops = summary["step"], summary["pretrain"]
    reference = steps.get("vits16_224_reference", {}).get("images_per_s")
    ours = [steps[k]["images_per_s"] for k in VITS16 if k in steps]
    if ours and reference:
        summary["speedup_vs_dino_reference"] = round(max(ours) / reference, 2)
    ours_in_the_loop = [loops[k]["loop_images_per_s"] for k in VITS16_LOOPS if k in loops]
    if ours_in_the_loop and reference:
        summary["loop_speedup_vs_dino_reference"] = round(max(ours_in_the_loop) / reference, 2)
    demand = {name: [steps[k]["images_per_s"] or 0 for k in names if k in steps]
              + [loops[k]["loop_images_per_s"] or 0 for k in names if k in loops]
              for name, names in LOADER_CONSUMERS.items()}
    for path in sorted(out.glob("loader_*.json")):
        loader = _read(path)
        if loader:
            summary["loader"][path.stem[7:]] = _loader_figures(loader, max(demand.get(path.stem[7:], []), default=0))
    best = max((k for k in VITS16 if k in steps),
               key=lambda k: steps[k]["images_per_s"] or 0, default=None)
    if best:
        summary["scaling_from"] = best
        _write_scaling(out / f"step_{best}.json", out / "scaling_vits16_224.json")
    chain = _read(out / "chain.json")
    if chain:
        summary["chain"] = {"knn_top1": {f"{name}:{tag}": result["top1"].get(str(result["best_k"]))
                                         for name, knn in chain["knn"].items()
                                         for tag, result in knn.get("tags", {}).items()},
                            "epochs": len(chain["epochs"]),
                            "images_per_s": [epoch.get("images_per_s") for epoch in chain["epochs"]]}
    stages = out / "stages.txt"
    if stages.exists():
        summary["stages"] = [line.split("\t") for line in stages.read_text().splitlines() if line]
    return summary


def _pretrain_figures(pretrain: dict) -> dict:
    loop, step = pretrain.get("loop", {}), pretrain.get("step", {})
    return {"loop_images_per_s": loop.get("images_per_s"), "loop_mfu": loop.get("mfu"),
            "step_images_per_s": step.get("images_per_s"), "step_mfu": step.get("mfu"),
            "loop_over_step": pretrain.get("loop_over_step"), "loader": pretrain.get("loader"),
            "compiled": pretrain.get("compiled"), "compile_mode": pretrain.get("compile_mode"),
            "precision": pretrain.get("precision"), "batch_size": pretrain.get("batch_size"),
            "peak_memory_gb": pretrain.get("peak_memory_gb"), "torch": pretrain.get("torch")}


def _loader_figures(loader: dict, demand: float) -> dict:
    device = loader["device_augment"]
    figures = {"crops": loader["settings"]["crops"], "workers": loader["settings"]["workers"],
               "torch": loader["settings"].get("torch"),
               "baseline_images_per_s": loader["baseline_scdino_style_images_per_s"],
               "packed_images_per_s": loader["packed_batched_images_per_s"],
               "device_augment_images_per_s": device["images_per_s"],
               "device_augment_cpu_ms_per_image": device["cpu_ms_per_image"],
               "dali_images_per_s": loader.get("dali_images_per_s"), "dali_device": loader.get("dali_device")}
    if device["cpu_ms_per_image"] > 0:
        share = LOADER_VCPUS_PER_GPU * 1000 / device["cpu_ms_per_image"]
        figures["device_augment_images_per_s_at_p5_cpu_share"] = round(share, 1)
        if demand:
            figures["step_demand_images_per_s"] = demand
            figures["supply_over_demand_at_p5_cpu_share"] = round(share / demand, 2)
    return figures


def _write_scaling(step_json: Path, out: Path) -> None:
    from contextlib import redirect_stdout

    from training.benchmarks.speed.scaling import main as scaling_main

    with out.open("w") as handle, redirect_stdout(handle):
        scaling_main(["--step-json", str(step_json)])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0]).is_dir():
        print("usage: python -m training.benchmarks.speed.gpu_summary DIR (a folder of scripts/gpu-bench.sh figures)",
              file=sys.stderr)
        return 2
    out = Path(args[0])
    summary = summarise(out)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    for name, step in summary["step"].items():
        print(f"step   {name:26s} {step['images_per_s']:10.1f} images/s   MFU {step['mfu']}   "
              f"{step['precision']}, batch {step['batch_size']}, peak {step['peak_memory_gb']} GB")
    for name, loop in summary["pretrain"].items():
        print(f"loop   {name:26s} {loop['loop_images_per_s']:10.1f} images/s   MFU {loop['loop_mfu']}   "
              f"(its step {loop['step_images_per_s']:.1f}: {loop['loop_over_step']}x), {loop['loader']} loader")
    if "speedup_vs_dino_reference" in summary:
        print(f"ViT-S/16 over DINO's reference step: {summary['speedup_vs_dino_reference']}x")
    if "loop_speedup_vs_dino_reference" in summary:
        print(f"ViT-S/16's pretrain loop over DINO's reference step: {summary['loop_speedup_vs_dino_reference']}x")
    for name, loader in summary["loader"].items():
        print(f"loader {name:26s} packed {loader['packed_images_per_s']:.1f}, device {loader['device_augment_images_per_s']:.1f}"
              f" images/s; at a p5 GPU's CPU share {loader.get('device_augment_images_per_s_at_p5_cpu_share')}"
              f" = {loader.get('supply_over_demand_at_p5_cpu_share')}x the step")
    for stage in summary.get("stages", []):
        print("stage  " + "  ".join(stage))
    print(f"figures: {out}/summary.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
