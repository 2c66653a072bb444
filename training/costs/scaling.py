"""Weak-scaling model: how efficiently does DINO pretraining scale across nodes of each preset?

Per-GPU batch is fixed (weak scaling). A DDP step costs its measured compute time plus the part of
the gradient all-reduce that backward does not hide:

    t_allreduce = grad_bytes * 2 (n - 1) / n / busbw      (busbw as nccl-tests reports it)
    exposed     = max(0, t_allreduce - overlap * t_backward)
    efficiency  = t_step / (t_step + exposed)

Inside one node the intra-node bus bandwidth applies; across nodes the inter-node one. FSDP moves
1.5x the bytes of DDP (all-gather in forward and backward, reduce-scatter of gradients) and pays only
when the replicated training state does not fit beside the activations. A bf16 gradient-compression
hook halves the all-reduce bytes and pays when communication is exposed. Bandwidths, GPU memory and
peaks come from the one instance table (training/costs/instances.py, each with its source)
unless a measured all-reduce figure replaces them. Standard library only: the planner
(training/planning/) and `python -m training.benchmarks.speed.scaling` both read it.

Inputs, field by field, and who writes them:
- the step, from `python -m training bench step` (training/benchmarks/speed/step.py): `benchmark`
  ("step"), `step_time_s`, `backward_s`, `params`, `flops_per_step`, and `mfu` and
  `peak_memory_gb`, which are null where they could not be measured (a CPU, an unknown GPU);
- the all-reduce, from `python -m training.benchmarks.speed.allreduce` (training/benchmarks/speed/allreduce.py):
  `busbw_gbs`, and `nodes`, which says whether it is the inside-one-node or the across-nodes figure.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from training.costs.instances import INSTANCES, InstanceFacts

GB = 1e9


@dataclass(frozen=True)
class Interconnect:
    gpus_per_node: int
    gpu_memory_gb: float
    intra_busbw_gbs: float
    inter_busbw_gbs: float
    peak_tflops: float
    source: str


    @classmethod
    def of(cls, facts: InstanceFacts) -> "Interconnect":
        """An instance type's figures from the one table (training/costs/instances.py), where
        each bandwidth and peak names its source: published nccl-tests figures where they exist,
        stated bounds otherwise; dense tensor-core peaks from NVIDIA's datasheets."""
        return cls(facts.gpus, facts.gpu.memory_gb, facts.intra_busbw_gbs, facts.inter_busbw_gbs,
                   facts.gpu.peak_tflops, facts.busbw_source)


PRESETS: dict[str, Interconnect] = {name: Interconnect.of(facts) for name, facts in INSTANCES.items()}

ADAMW_STATE_BYTES_PER_PARAM = 4 + 4 + 8  # fp32 weights, gradients, two moments
TEACHER_BYTES_PER_PARAM = 4


def allreduce_seconds(nbytes: float, busbw_gbs: float, ranks: int) -> float:
    if ranks <= 1:
        return 0.0
    return nbytes * 2 * (ranks - 1) / ranks / (busbw_gbs * GB)


@dataclass(frozen=True)
class StepProfile:
    step_time_s: float
    backward_s: float
    params: int
    activation_gb: float = 0.0
    flops_per_step: float = 0.0
    mfu: float = 0.0

    def on(self, net: Interconnect) -> tuple["StepProfile", str]:
        """This step on another GPU, assuming the same MFU when the FLOPs and MFU are known."""
        if not (self.flops_per_step and self.mfu):
            return self, "measured step time, applied to every preset"
        step = self.flops_per_step / (self.mfu * net.peak_tflops * 1e12)
        scale = step / self.step_time_s
        return (StepProfile(step, self.backward_s * scale, self.params, self.activation_gb,
                            self.flops_per_step, self.mfu),
                f"FLOPs per step at the measured MFU ({self.mfu:.1%}) of this preset's peak")


def efficiency(profile: StepProfile, net: Interconnect, nodes: int, *, grad_bytes_per_param: float,
               volume_factor: float = 1.0, overlap: float = 0.8) -> tuple[float, float]:
    """(efficiency, exposed communication seconds) of one weak-scaled step on `nodes` nodes."""
    ranks = nodes * net.gpus_per_node
    busbw = net.inter_busbw_gbs if nodes > 1 else net.intra_busbw_gbs
    comm = volume_factor * allreduce_seconds(profile.params * grad_bytes_per_param, busbw, ranks)
    exposed = max(0.0, comm - overlap * profile.backward_s)
    return profile.step_time_s / (profile.step_time_s + exposed), exposed


def replicated_state_gb(params: int) -> float:
    """What every DDP rank holds besides activations: fp32 weights, gradients, AdamW moments, teacher."""
    return params * (ADAMW_STATE_BYTES_PER_PARAM + TEACHER_BYTES_PER_PARAM) / GB


def fsdp_verdict(profile: StepProfile, net: Interconnect) -> str:
    state_gb = replicated_state_gb(profile.params)
    if state_gb + profile.activation_gb < 0.7 * net.gpu_memory_gb:
        return (f"DDP: the replicated state ({state_gb:.2f} GB) fits; FSDP would add 50% more "
                "communication for no memory benefit")
    return (f"FSDP: the replicated state ({state_gb:.2f} GB) plus activations exceed 70% of "
            f"{net.gpu_memory_gb:.0f} GB; sharding frees memory for larger batches")


def predict(profile: StepProfile, node_counts: list[int], presets: dict[str, Interconnect],
            overlap: float = 0.8) -> dict:
    out: dict = {"model": {"overlap": overlap, **asdict(profile)}, "presets": {}}
    for name, net in presets.items():
        rows = []
        base = profile
        profile, basis = base.on(net)
        for nodes in node_counts:
            ddp, exposed = efficiency(profile, net, nodes, grad_bytes_per_param=4, overlap=overlap)
            bf16, _ = efficiency(profile, net, nodes, grad_bytes_per_param=2, overlap=overlap)
            fsdp, _ = efficiency(profile, net, nodes, grad_bytes_per_param=4, volume_factor=1.5,
                                 overlap=overlap)
            rows.append({
                "nodes": nodes, "gpus": nodes * net.gpus_per_node,
                "efficiency_ddp": round(ddp, 4), "efficiency_ddp_bf16_grads": round(bf16, 4),
                "efficiency_fsdp": round(fsdp, 4), "exposed_comm_ms": round(exposed * 1e3, 3),
                "compression_pays": exposed > 0.05 * profile.step_time_s,
            })
        out["presets"][name] = {"interconnect": asdict(net), "fsdp": fsdp_verdict(profile, net),
                                "step_time_s": round(profile.step_time_s, 6),
                                "step_time_basis": basis, "rows": rows}
        profile = base
    return out


# The fields of `bench step` output this model reads (see the module docstring); the nullable ones
# are null where the benchmark could not measure them.
STEP_FIELDS = ("step_time_s", "backward_s", "params", "flops_per_step")
STEP_NULLABLE_FIELDS = ("mfu", "peak_memory_gb")


def profile_from_step_json(data: dict) -> StepProfile:
    """Read `python -m training bench step` output into the model's step profile.

    The activation memory is the measured peak less the replicated state, so that fsdp_verdict
    compares the measured footprint, not an estimate, with the GPU's memory.
    """
    if data.get("benchmark") != "step":
        raise SystemExit("error: --step-json is not the output of `python -m training bench step` "
                         f"(its \"benchmark\" is {data.get('benchmark')!r}, not \"step\")")
    missing = [key for key in STEP_FIELDS + STEP_NULLABLE_FIELDS if key not in data]
    if missing:
        raise SystemExit(f"error: --step-json lacks {', '.join(missing)}: rerun `python -m training bench step`")
    params = int(data["params"])
    peak = data["peak_memory_gb"]
    activation_gb = max(0.0, float(peak) - replicated_state_gb(params)) if peak is not None else 0.0
    return StepProfile(float(data["step_time_s"]), float(data["backward_s"]), params, activation_gb,
                       float(data["flops_per_step"]), float(data["mfu"] or 0.0))


def with_measured_busbw(net: Interconnect, data: dict, name: str) -> Interconnect:
    """The preset with a measured `allreduce` figure in place of the published one: the
    across-nodes figure when it was measured across nodes, else the inside-one-node one."""
    try:
        busbw, nodes = float(data["busbw_gbs"]), int(data["nodes"])
    except (KeyError, TypeError, ValueError) as exc:
        raise SystemExit(f"error: --busbw-json lacks {exc}: give the output of "
                         "`python -m training.benchmarks.speed.allreduce --out`") from None
    if nodes > 1:
        return replace(net, inter_busbw_gbs=busbw, source=f"measured across {nodes} nodes: {name}")
    return replace(net, intra_busbw_gbs=busbw, source=f"measured inside one node: {name}")
