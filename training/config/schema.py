"""The run configuration's schema: a tree of typed, validated dataclasses (the root `Config`, the run
and training sections here; `data:`, `eval:` and `ingest:` in their own modules), and how a plain tree
becomes one (`from_dict`).

Unknown keys, wrong types and out-of-range values raise :class:`ConfigError` naming the dotted key
and what is allowed; the conversion itself is training/config/dotted.py, shared with the CDK app's
settings. Loading files and `--set` overrides is training/config/load.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from training.config.data import DataConfig
from training.config.dotted import Conversion, DottedKeyError, flatten_dotted
from training.config.dotted import hint_of as _hint_of
from training.config.dotted import set_dotted as _set_dotted
from training.config.eval import EvalConfig
from training.config.ingest import IngestConfig
from training.config.validation import ConfigError

__all__ = [
    "Config", "ConfigError", "DataConfig", "DinoConfig", "EvalConfig", "IngestConfig", "ModelConfig", "OptimConfig",
    "RunConfig", "TrainConfig", "flatten_dotted", "from_dict", "hint_of", "set_dotted",
]


@dataclass(frozen=True)
class RunConfig:
    name: str = "demo"
    """Run name, used in log lines and the report title."""
    output_dir: str = "runs/demo"
    """Run directory: every step writes its outputs below it (see training/rundir/layout.py)."""
    seed: int = 0
    """Seed for the hold-out split, augmentations, initialisation and kNN split."""
    combination: str = ""
    """The one entry of data.channel_combinations this step works on, set by slurm/submit_pipeline.sh
    for each combination's chain: the step then reads and writes <output_dir>/channels_<combination>/
    (training/rundir/layout.py), shares the packed data, split and mean/std of <output_dir>, and uses
    these channels as data.channels. Empty: the run itself, on data.channels."""
    channel_adaptive: Literal["", "bag_of_channels", "channel_vit"] = ""
    """This step works on one of the channel-adaptive models of data.compare_channel_adaptive (one of
    data.channel_adaptive_kinds), set by slurm/submit_pipeline.sh: <output_dir>/channel_adaptive_<kind>/,
    trained with model.kind <kind> on every channel of data.channels. With run.combination as well:
    that model evaluated on the combination's channels without retraining (features, labels, knn,
    linear), in channel_adaptive_<kind>/channels_<combination>/, reading the model's checkpoints. All
    share the packed data, split and mean/std of <output_dir> (training/rundir/layout.py). Empty:
    not a channel-adaptive model's step."""



@dataclass(frozen=True)
class ModelConfig:
    arch: Literal["vit_tiny", "vit_small", "vit_base"] = "vit_small"
    """ViT size (timm); ViT-S is scDINO's published model."""
    patch_size: Literal[8, 16] = 16
    """Patch size in pixels; 8 sees finer detail at 4x the tokens."""
    drop_path_rate: float = 0.1
    """Stochastic depth of the student."""
    out_dim: int = 65536
    """DINO head output dimension (number of prototypes)."""
    norm_last_layer: bool = True
    """Weight-normalise the head's last layer (stabler; scDINO default)."""
    use_bn_in_head: bool = False
    """BatchNorm in the projection head MLP."""
    pretrained: str = ""
    """Optional DINO/scDINO checkpoint to start from; the patch embedding is adapted to the channel count."""
    channel_adaptation: Literal["mean", "mean_rescaled"] = "mean"
    """How weights made for another channel count (ImageNet RGB, a 1-channel scDINO model) meet
    data.channels: each new channel gets the patch-embedding filter averaged over the old ones.
    "mean" (default) is scDINO's `use_mean_patch_embedding`, so that published weights evaluated here
    give scDINO's features; "mean_rescaled" also multiplies by C_old / C_new, which keeps the response
    to an image whose channels are all equal (RGB weights see strongly correlated channels; stains
    are not, so neither scaling is right in general)."""
    pos_embed_interpolation: Literal["dino", "timm"] = "dino"
    """How the position embedding is resampled for crops of another size than the stored grid (local
    crops, evaluation sizes): "dino" as facebookresearch/dino (bicubic with scale factor
    (grid + 0.1) / sqrt(N), no antialias), so that a DINO or scDINO checkpoint gives DINO's features
    at every size; "timm" as timm (antialiased, to the exact size), about 2 % away at 96 px."""
    kind: Literal["vit", "channel_vit", "bag_of_channels"] = "vit"
    """"vit": scDINO's ViT, all channels stacked into one patch embedding (one model per channel
    combination). The other two are channel-adaptive: one model trained on data.channels encodes any
    subset of them, chosen at evaluation by data.channels. "bag_of_channels": one shared
    single-channel ViT; pretraining shows it one channel of each image at a time, and a
    combination's feature is built from its channels' CLS features (model.bag_combine); a step costs
    one channel's tokens per view, about what the plain ViT costs (training/models/channel_bag.py).
    "channel_vit": each channel embedded on its own by a shared single-channel patch projection plus
    a learned embedding of its original channel id, the present channels' tokens concatenated
    (ChannelViT); C times the tokens, so several times the compute per step, and on the synthetic set
    it collapses (docs/performance.md) (training/models/channel_vit.py, docs/training.md)."""
    bag_combine: Literal["concat", "concat_normalized", "mean", "concat_pairs"] = "concat_pairs"
    """How a "bag_of_channels" model turns a combination's channels into one feature (ignored by the
    other kinds): "concat" their CLS features in channel order (C x embed_dim wide),
    "concat_normalized" the same with each channel's feature L2-normalised first (every channel
    weighs the same), "mean" their average (embed_dim wide), "concat_pairs" (default) the "concat"
    features followed by one per pair of channels, the pair encoded as one image, the mean of its
    two channels ((C + C(C-1)/2) x embed_dim wide; C(C+1)/2 encodings per image at evaluation, 15
    for 5 channels, instead of C). An evaluation-time choice: the same checkpoint serves all four.
    The default is the one measured best on the synthetic sets (docs/performance.md)."""
    bag_channels_per_image: int = 1
    """How many distinct channels of each image a "bag_of_channels" pretraining step encodes, each as
    an image of its own (drawn per image and step; teacher and student see the same ones). 1 is the
    published recipe and costs the plain ViT's tokens; k multiplies the step's compute by k."""
    channel_sampling: Literal["all", "hierarchical"] = "hierarchical"
    """Channels each training step shows a "channel_vit" (ignored by "vit"). "hierarchical": per step,
    a size k uniform in 1..C, then k channels uniform among the C (ChannelViT's hierarchical
    sampling: every subset size equally often, so single channels are trained as much as the full
    set), the same for every image, view and rank, teacher and student alike, drawn from
    (run.seed, global step) so that a resumed run draws the same. "all": every channel every step."""
    channel_embed_init: Literal["normal", "orthogonal"] = "normal"
    """How a "channel_vit" initialises its channel embeddings: "normal" (truncated normal, std 0.02,
    as its position embedding) or "orthogonal" (orthogonal rows of the same norm, as CHAMMI-75's DINO
    ChannelViT does, so that channels start out as far apart as they can be)."""

    def __post_init__(self) -> None:
        if self.bag_channels_per_image < 1:
            raise ConfigError(f"model.bag_channels_per_image must be >= 1, got {self.bag_channels_per_image}")


@dataclass(frozen=True)
class DinoConfig:
    global_crop_size: int = 224
    """Side of the two global crops in pixels."""
    local_crop_size: int = 96
    """Side of the local crops in pixels."""
    global_crops_scale: tuple[float, float] = (0.4, 1.0)
    """Area range of global crops (scDINO paper run: 0.4-1.0)."""
    local_crops_number: int = 8
    """Number of local crops per image."""
    local_crops_scale: tuple[float, float] = (0.05, 0.4)
    """Area range of local crops."""
    warmup_teacher_temp: float = 0.04
    """Teacher temperature at the start of its warm-up."""
    teacher_temp: float = 0.04
    """Teacher temperature after warm-up."""
    warmup_teacher_temp_epochs: int = 0
    """Epochs of linear teacher-temperature warm-up."""
    student_temp: float = 0.1
    """Student softmax temperature."""
    center_momentum: float = 0.9
    """EMA rate of the teacher-output centre."""
    momentum_teacher: float = 0.996
    """Base EMA rate of the teacher weights, raised to 1 by a cosine schedule."""
    photometric_augment: bool = True
    """scDINO's per-channel brightness, Gaussian blur and solarisation on top of the crops and flips.
    false: crops and flips only, as CHAMMI-75's DINO ChannelViT trains (a stain's intensity is
    information there, not nuisance), and no imaging step (dino.black_level_p, dino.noise_p) either."""
    black_level_p: float = 0.0
    """Probability that a crop gets a random black level after the blur, before dino.noise_p's noise
    (not in scDINO: 0 keeps its augmentations exactly): each channel x -> max(x - t, 0) / (1 - t),
    t ~ U(0, black_level_max), as a camera's offset or a higher background cuts the dim floor away.
    Imaging batches differ in background and noise floor, which per-image min-max scaling does not
    remove and DINO otherwise learns to tell cells apart by (docs/performance.md, "Imaging noise")."""
    black_level_max: float = 0.1
    """The largest black level of dino.black_level_p, as a fraction of the min-max scaled [0, 1] range."""
    black_level_min: float = 0.0
    """The smallest black level of dino.black_level_p: t ~ U(black_level_min, black_level_max). Below 0
    the level lifts the floor instead of cutting it, x -> (x + |t|) / (1 + |t|), a pedestal on which the
    noise then stays whole, as a camera's offset set above a dim batch's background leaves it; 0 keeps
    the cut only."""
    noise_p: float = 0.0
    """Probability that a crop gets Gaussian imaging noise after the blur and any black level (not in
    scDINO: 0 keeps its augmentations exactly). Each channel of such a crop draws its own sigma,
    U(0, noise_std), and the crop is then clamped to [0, 1]. With dino.black_level_p, it taught the
    model to read a cell's phenotype across batches told apart by their noise floor; configs/screen.yaml
    uses both, with mean well profiles (docs/performance.md, "Imaging noise", "Wells by their mean")."""
    noise_std: float = 0.1
    """The largest noise sigma of dino.noise_p, as a fraction of the min-max scaled [0, 1] range."""

    def __post_init__(self) -> None:
        for key in ("black_level_p", "noise_p"):
            if not 0 <= getattr(self, key) <= 1:
                raise ConfigError(f"dino.{key} must be a probability between 0 and 1, got {getattr(self, key)}")
        if not 0 <= self.black_level_max < 1:
            raise ConfigError(f"dino.black_level_max must be in [0, 1) (a fraction of the [0, 1] pixel range), "
                              f"got {self.black_level_max}")
        if not -1 < self.black_level_min <= self.black_level_max:
            raise ConfigError(f"dino.black_level_min must be in (-1, dino.black_level_max={self.black_level_max}] "
                              f"(below 0 a pedestal, above it a cut), got {self.black_level_min}")
        if not 0 <= self.noise_std <= 1:
            raise ConfigError(f"dino.noise_std must be between 0 and 1 (a fraction of the [0, 1] pixel range), "
                              f"got {self.noise_std}")
        for key in ("global_crops_scale", "local_crops_scale"):
            low, high = getattr(self, key)
            if not 0 < low <= high <= 1:
                raise ConfigError(f"dino.{key} must satisfy 0 < low <= high <= 1, got {(low, high)}")
        if self.local_crops_number < 0:
            raise ConfigError(f"dino.local_crops_number must be >= 0, got {self.local_crops_number}")


@dataclass(frozen=True)
class OptimConfig:
    epochs: int = 100
    """Pretraining epochs."""
    batch_size_per_gpu: int = 30
    """Images per rank per step (scDINO: 30)."""
    lr: float = 0.0005
    """Peak learning rate for a global batch of 256; scaled linearly with the real global batch."""
    min_lr: float = 1e-6
    """Learning rate at the end of the cosine schedule."""
    warmup_epochs: int = 10
    """Linear learning-rate warm-up epochs."""
    weight_decay: float = 0.04
    """Weight decay at the start of its cosine schedule."""
    weight_decay_end: float = 0.4
    """Weight decay at the end."""
    clip_grad: float = 3.0
    """Gradient norm clipping per parameter tensor; 0 disables it."""
    freeze_last_layer: int = 1
    """Epochs during which the head's last layer is not updated."""

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ConfigError(f"optim.epochs must be >= 1, got {self.epochs}")
        if self.batch_size_per_gpu < 1:
            raise ConfigError(f"optim.batch_size_per_gpu must be >= 1, got {self.batch_size_per_gpu}")
        if self.lr <= 0:
            raise ConfigError(f"optim.lr must be > 0, got {self.lr}")


@dataclass(frozen=True)
class TrainConfig:
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    """auto: bf16 where the GPU supports it, fp16 with a gradient scaler otherwise; on CPU bf16 where
    the CPU has it natively (AVX512-BF16 or AMX), fp32 elsewhere (emulated bf16 is ~12x slower)."""
    compile: bool = False
    """Wrap the models with torch.compile."""
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
    """torch.compile's mode under train.compile. "reduce-overhead" replays the compiled backbones'
    forward and backward passes as CUDA graphs (one per crop size: the shapes are fixed), which
    removes most kernel-launch cost where small crops make the step launch-bound; "max-autotune"
    also searches kernel configurations (long compiles), with graphs; "max-autotune-no-cudagraphs"
    without. Graphs take effect on a GPU only; measured on one GPU only (docs/performance.md)."""
    parallel: Literal["ddp", "fsdp"] = "ddp"
    """Data parallelism: DDP replicates the student; FSDP shards it."""
    saveckp_freq: int = 5
    """Keep a numbered checkpoint every N epochs (the latest is always kept)."""
    saveckp_rule: Literal["every_n", "scdino"] = "every_n"
    """Which epochs get a numbered checkpoint. "every_n": after N, 2N, ... completed epochs.
    "scdino": after 1, N + 1, 2N + 1, ... completed epochs (DINO's and scDINO's `epoch % N == 0`
    on 0-based epochs) and after the last, the epochs scDINO's Snakefile analyses; set when an
    scDINO YAML is converted. Numbers count completed epochs: scDINO's checkpoint0.pth is epoch_0001."""
    keep_last: int = 0
    """How many numbered checkpoints to keep; 0 keeps them all. `features` evaluates every numbered
    epoch by default (the per-epoch kNN curve), so pruning would take away what evaluation reads:
    set this only when disk space matters more than that curve."""
    log_every: int = 10
    """Steps between metric lines."""
    tensorboard: bool = True
    """Write TensorBoard event files under <run>/tensorboard."""
    wandb: bool = False
    """Log to Weights & Biases from rank 0 (offline unless WANDB_MODE says otherwise)."""
    max_steps_per_epoch: int = 0
    """Cap on steps per epoch (0 = the whole epoch); for smoke tests and benchmarks."""
    checkpoint_every_minutes: float = 30.0
    """Also save checkpoint.pth mid-epoch once this many minutes have passed since the last save
    (0 = at epoch ends only), so that a crash or a lost node costs at most this much training. 30:
    an epoch of scDINO's data can take hours on a few GPUs, while a save takes seconds, so this costs
    well under 1 % of the time and bounds the loss to half an hour. Mid-epoch saves are never
    numbered (evaluation reads numbered epochs only) and never pruned."""
    hang_timeout_minutes: float = 20.0
    """A rank that completes no training step (or save) for this long logs where it stopped and
    exits with status 76, so the launcher restarts the job instead of letting a stuck collective
    burn the allocation to its time limit (0 = no watchdog). Must exceed the slowest step including
    the first (torch.compile, loader start-up) and a checkpoint save on a slow file system."""
    spot_watch: Literal["auto", "on", "off"] = "auto"
    """Poll the EC2 instance metadata for a Spot interruption notice (two minutes ahead) and then
    save and stop as on SIGUSR1, so the job requeues from a fresh checkpoint. auto: only on EC2 (the
    firmware says so) or where SCDINO_IMDS_ENDPOINT names a metadata server."""
    stop_on_collapse: bool = False
    """When the teacher output has collapsed (train.collapse_*; training/dino/collapse.py), save a
    checkpoint and stop as a deterministic failure that the launcher does not retry, instead of only
    warning: a collapsed DINO run does not recover by itself and would burn its GPU-hours."""
    collapse_uniform_margin: float = 0.3
    """Uniform collapse: the mean entropy of the teacher's target over the window
    (train.collapse_patience_steps) is within this many nats of ln(model.out_dim) (its KL divergence
    from the uniform distribution is below it). Measured on the demo's data (docs/training.md,
    "Collapse"): healthy runs stayed 0.36 nats or more away at every step, and their window means
    0.47 or more; runs made to collapse (teacher temperature 0.2, learning rate x60) came within 0.05
    and 0.11 by their fourth epoch, channel_vit, which ends at its random initialisation's kNN, within
    0.16 to 0.31 from its third, and the masked-channels runs' window means within 0.23 to 0.25."""
    collapse_one_hot_entropy: float = 0.5
    """One-hot collapse: the entropy of the batch-mean target (and so the per-image one, which it
    bounds) is below this many nats, fewer than e^0.5 = 1.6 prototypes' worth for the whole batch.
    Measured: healthy runs never below 5.1; without centring and a batch-norm-free head it falls
    below 0.5 from step 19 and to 0.002 by step 40."""
    collapse_patience_steps: int = 50
    """The window: a kind holds when the mean teacher statistics of the last this many steps after the
    warm-ups (the later of optim.warmup_epochs and dino.warmup_teacher_temp_epochs) look like it; 0
    turns detection off. A mean rather than every step, because a near-uniform run's per-step
    entropy is noisy (one measured run dipped in and out of the margin, at most 8 steps in a row
    inside it); 50 steps cost under 2 epochs of the demo, a fraction of one on real data."""

    def __post_init__(self) -> None:
        if self.compile_mode != "default" and not self.compile:
            raise ConfigError(f"train.compile_mode={self.compile_mode} applies to compiled models: "
                              "set train.compile=true as well, or leave train.compile_mode at default")
        for key in ("checkpoint_every_minutes", "hang_timeout_minutes"):
            value = getattr(self, key)
            if not value >= 0:  # also refuses NaN
                raise ConfigError(f"train.{key} must be >= 0 (0 turns it off), got {value}")
        if self.keep_last < 0:
            raise ConfigError(f"train.keep_last must be >= 0 (0 keeps every numbered checkpoint), "
                              f"got {self.keep_last}")
        for key in ("collapse_uniform_margin", "collapse_one_hot_entropy"):
            if not getattr(self, key) > 0:  # also refuses NaN
                raise ConfigError(f"train.{key} must be > 0 nats, got {getattr(self, key)}")
        if self.collapse_patience_steps < 0:
            raise ConfigError(f"train.collapse_patience_steps must be >= 0 (0 turns detection off), "
                              f"got {self.collapse_patience_steps}")



@dataclass(frozen=True)
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    dino: DinoConfig = field(default_factory=DinoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    ingest: IngestConfig = field(default_factory=IngestConfig)

    def __post_init__(self) -> None:
        """A combination's step trains (or, under run.channel_adaptive, evaluates) on the combination's
        channels (see run.combination); a channel-adaptive model is of the kind run.channel_adaptive names."""
        if self.data.per_image_normalization and not self.eval.normalize:
            raise ConfigError("eval.normalize=false evaluates on unnormalised images, but data.normalization="
                              "per_image trains on per-image z-scored ones: set eval.normalize=true, or "
                              "data.normalization=dataset to evaluate scDINO weights as scDINO does")
        imaging = [k for k in ("black_level_p", "noise_p") if getattr(self.dino, k) > 0]
        if imaging and self.data.loader == "dali":
            raise ConfigError(f"{', '.join('dino.' + k for k in imaging)} (the imaging step) is not supported by "
                              "data.loader=dali: use data.loader=packed (with data.gpu_augment=true on a GPU), or set "
                              "them to 0")
        if self.eval.feature == "cls_patch_mean" and self.model.kind != "vit":
            raise ConfigError(f"eval.feature=cls_patch_mean pools a plain ViT's patch tokens, and model.kind="
                              f"{self.model.kind} combines channels' features instead: set eval.feature=cls")
        self._select_channel_adaptive()
        combination = self.run.combination
        if not combination:
            self.data.check_channel_adaptive()
            return
        if combination not in self.data.channel_combinations:
            listed = self.data.channel_combinations
            allowed = ", ".join(map(repr, listed)) or "none (data.channel_combinations is empty)"
            raise ConfigError(f"run.combination={combination!r} is not in data.channel_combinations; "
                              f"allowed: {allowed}")
        if self.data.channels != combination:
            object.__setattr__(self, "data", self.data.for_combination(combination))

    def _select_channel_adaptive(self) -> None:
        kind = self.run.channel_adaptive
        if not kind:
            return
        if not self.data.compare_channel_adaptive:
            raise ConfigError(f"run.channel_adaptive={kind} picks a channel-adaptive model of "
                              "data.compare_channel_adaptive, which is false: set data.compare_channel_adaptive=true")
        if kind not in self.data.channel_adaptive_kinds:
            raise ConfigError(f"run.channel_adaptive={kind} is not in data.channel_adaptive_kinds "
                              f"({', '.join(self.data.channel_adaptive_kinds)}): add it there or pick one of those")
        if self.model.kind != kind:
            object.__setattr__(self, "model", dataclasses.replace(self.model, kind=kind))

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(dataclasses.asdict(self))

    def replace(self, overrides: dict[str, Any]) -> "Config":
        """A copy with dotted-key overrides applied, e.g. {"optim.lr": 1e-4}."""
        tree = self.to_dict()
        for dotted, value in overrides.items():
            set_dotted(tree, dotted, value)
        return from_dict(tree)


def _to_plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_plain(v) for v in value]
    return value


class _ConfigConversion(Conversion):
    """The shared conversion, plus one hint where YAML has already lost what the user meant."""

    def convert(self, key: str, value: Any, hint: Any) -> Any:
        if hint is str and isinstance(value, int) and key.startswith(("data.channels", "data.channel_combinations[")):
            # YAML reads 01234 as the octal number 668 and 012 as 10: the digits are already lost
            example = "channels: \"01234\"" if key == "data.channels" else "channel_combinations: [\"01234\", \"0\"]"
            raise ConfigError(f"{key} must be quoted, e.g. {example} (unquoted, YAML reads "
                              f"the digits as a number: {value!r})")
        return super().convert(key, value, hint)


_CONVERSION = _ConfigConversion()


def set_dotted(tree: dict[str, Any], dotted_key: str, value: Any) -> None:
    """Set tree["a"]["b"] = value for "a.b", adding a missing section of the schema (a tree from a
    YAML file need not have every section); an unknown section is an error naming the allowed ones."""
    try:
        _set_dotted(tree, dotted_key, value, Config)
    except DottedKeyError as error:
        raise ConfigError(str(error)) from None


def hint_of(dotted_key: str) -> Any:
    """The declared type of a dotted config key, or None for an unknown key."""
    return _hint_of(Config, dotted_key)


def from_dict(data: dict[str, Any]) -> Config:
    """Build and validate a Config from a plain nested mapping."""
    try:
        return _CONVERSION.build(Config, data)
    except DottedKeyError as error:
        raise ConfigError(str(error)) from None
