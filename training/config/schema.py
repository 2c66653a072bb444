"""The run configuration's schema: a tree of typed, validated dataclasses, and how a plain tree
becomes one (`from_dict`).

Unknown keys, wrong types and out-of-range values raise :class:`ConfigError` naming the dotted key
and what is allowed. Loading files and `--set` overrides is training/config/load.py.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_origin

from training.errors import UserError


class ConfigError(UserError, ValueError):
    """A configuration value is missing, unknown or invalid; the message names the key."""


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
class DataConfig:
    source: str = "runs/demo/data/images"
    """Folder of TIFF images in class folders (scDINO layout), or a packed dataset folder."""
    packed_dir: str = ""
    """Where `prepare` writes the packed dataset; empty means <output_dir>/packed."""
    channels: str = "01234"
    """Channels to use, as digits in scDINO's style: "01234" all five, "2" only the third."""
    channel_names: tuple[str, ...] = ()
    """Names of the selected channels for plots; empty means ch0, ch1, ..."""
    channel_combinations: tuple[str, ...] = ()
    """Channel subsets to compare, scDINO's selected_channel_combination_per_run, e.g. ["01234", "0",
    "1"]: slurm/submit_pipeline.sh runs one pretraining and downstream chain per entry and then
    `compare`, to show what each channel contributes. Empty: one run on data.channels."""
    compare_channel_adaptive: bool = False
    """Besides one model per entry of data.channel_combinations, train ONE channel-adaptive model of
    each kind in data.channel_adaptive_kinds (on every channel of data.channels) and evaluate it on
    each combination without retraining: `compare` then puts the ways side by side, each with its
    training compute, which answers whether one model serves every combination as well as scDINO's
    per-combination models and at what cost. Needs data.channel_combinations, each a subset of
    data.channels. With eval.knn_whiten a bag of channels' concatenated features are no longer
    diluted by their uninformative channels in the kNN (docs/performance.md)."""
    channel_adaptive_kinds: tuple[str, ...] = ("bag_of_channels",)
    """The model.kind of each channel-adaptive model data.compare_channel_adaptive trains:
    "bag_of_channels" (kept: with eval.knn_whiten, level with or ahead of the per-combination models
    on the synthetic sets for a third of their compute) and/or "channel_vit" (collapses there;
    docs/performance.md)."""
    folder_depth_for_labels: int = 0
    """Which parent folder names the class: 0 is the image's own folder, 1 its parent, ..."""
    channel_axis: Literal["auto", "first", "last"] = "auto"
    """Where channels lie in the TIFF array; auto takes the smallest axis."""
    on_bad_image: Literal["skip", "fail"] = "skip"
    """Corrupt, empty or wrong-shape images: skip (counted and reported) or stop the step."""
    holdout_fraction: float = 0.2
    """Fraction held out from pretraining for features, kNN and the linear probe (scDINO: 0.2)."""
    split_method: Literal["stratified", "scdino"] = "stratified"
    """How the hold-out set is drawn. "stratified" (default for new runs): round(fraction x n) images
    of each class, so small datasets keep every class on both sides. "scdino": scDINO's split, a
    seeded NumPy shuffle of every image file as torchvision's ImageFolder lists them, the first
    floor(fraction x n) held out; set when an scDINO YAML is converted, so that an scDINO-trained
    checkpoint is evaluated on the images it did not train on."""
    mean_std_fraction: float = 0.2
    """Fraction of training images used to estimate the per-channel mean and std."""
    mean_std_max_images: int = 100_000
    """At most this many of them (0: no cap). A screen of 10^7 cells would otherwise read 2 x 10^6
    cells one at a time; 10^5 cells of a few thousand pixels each fix a channel's mean and std to well
    under a per cent, and datasets of up to 500,000 training images are unaffected."""
    normalization: Literal["dataset", "per_image"] = "dataset"
    """How pixels are standardised for the encoder, after the per-image min-max scaling every loader
    does. "dataset" (scDINO): minus the dataset's per-channel mean, over its std (mean_std.json).
    "per_image": each channel of each image z-scored with its own mean and std, taken over the whole
    image before cropping (CHAMMI-75's channel-adaptive DINO recipe), so that a stain whose level and
    spread vary from image to image meets the encoder on one scale. Pretraining, features, the
    linear probe, fine-tuning and the attention plots all follow it; the DALI loader does not
    support "per_image"."""
    mean_std_file: str = ""
    """A JSON file {"mean": [...], "std": [...]} with one value per image channel (scDINO's
    mean_and_std_of_dataset.txt) used instead of <run>/mean_std.json; empty means the run's own."""
    num_workers: int = 2
    """DataLoader worker processes per rank."""
    loader: Literal["auto", "tiff", "packed", "dali"] = "auto"
    """Which loader feeds training; auto uses the packed dataset when one exists."""
    gpu_augment: bool = False
    """Run multi-crop augmentation on the GPU as batched tensor operations."""
    label_column: str = ""
    """The per-cell table's column (packed/cells.arrow) that gives each cell's class for the split,
    kNN, the linear probe and the plots, with or without the Metadata_ prefix (e.g. Treatment for
    Metadata_Treatment). Empty: the class folder (Metadata_Class) of a dataset packed from class
    folders, else one class for every cell. Cells without a value are left out of the evaluation."""
    batch_column: str = ""
    """The column naming each cell's imaging batch (e.g. Metadata_Batch or Metadata_Plate). Set, kNN
    also reports "not same batch" accuracy (a query never votes with a cell of its own batch), as
    imaging batches otherwise make any representation look better than it is. Empty: no batches."""
    balance_column: str = ""
    """A per-cell column (e.g. Metadata_Batch) whose values every pretraining batch holds alike: the
    sampler lets them take turns, so that no step sees one imaging batch more than another. Empty:
    uniform shuffling, as scDINO."""
    control_column: str = ""
    """The column that marks control cells (e.g. Metadata_Treatment), for profiles normalised on the
    controls (`export`); empty: no controls."""
    control_value: str = ""
    """The value of control_column that marks a control (e.g. DMSO)."""

    def __post_init__(self) -> None:
        if not self.channels or not self.channels.isdigit():
            raise ConfigError(f"data.channels must be digits such as '01234', got {self.channels!r}")
        if len(set(self.channels)) != len(self.channels):
            raise ConfigError(f"data.channels repeats a channel: {self.channels!r}")
        _check_fraction("data.holdout_fraction", self.holdout_fraction, allow_zero=True)
        _check_fraction("data.mean_std_fraction", self.mean_std_fraction, allow_zero=False)
        if isinstance(self.mean_std_max_images, bool) or not isinstance(self.mean_std_max_images, int) \
                or self.mean_std_max_images < 0:
            raise ConfigError(f"data.mean_std_max_images must be a whole number of images, 0 for no cap, "
                              f"got {self.mean_std_max_images!r}")
        if self.channel_names and len(self.channel_names) != len(self.channels):
            raise ConfigError(
                f"data.channel_names has {len(self.channel_names)} names for "
                f"{len(self.channels)} channels ({self.channels!r})"
            )
        if self.num_workers < 0:
            raise ConfigError(f"data.num_workers must be >= 0, got {self.num_workers}")
        if bool(self.control_column) != bool(self.control_value):
            raise ConfigError("data.control_column and data.control_value go together (e.g. control_column: "
                              f"Metadata_Treatment, control_value: DMSO); got {self.control_column!r} and "
                              f"{self.control_value!r}")
        if self.per_image_normalization and self.loader == "dali":
            raise ConfigError("data.normalization=per_image is not supported by data.loader=dali (its crops are "
                              "normalised with one mean and std per channel): use data.loader=packed or auto")
        self._check_combinations()

    def _check_combinations(self) -> None:
        """Each combination is a channel selection like data.channels, and each is run once."""
        for combination in self.channel_combinations:
            if not combination.isdigit() or len(set(combination)) != len(combination):
                raise ConfigError("data.channel_combinations entries must be digits without repeats, such as "
                                  f"'01234' or '2', got {combination!r}")
        if len(set(self.channel_combinations)) != len(self.channel_combinations):
            raise ConfigError(f"data.channel_combinations lists a combination twice: {list(self.channel_combinations)}")
        adaptive_kinds = ("bag_of_channels", "channel_vit")
        if not set(self.channel_adaptive_kinds) <= set(adaptive_kinds) or not self.channel_adaptive_kinds or \
                len(set(self.channel_adaptive_kinds)) != len(self.channel_adaptive_kinds):
            raise ConfigError(f"data.channel_adaptive_kinds must list distinct kinds among {', '.join(adaptive_kinds)}, "
                              f"got {list(self.channel_adaptive_kinds)}")
        if self.compare_channel_adaptive and not self.channel_combinations:
            raise ConfigError("data.compare_channel_adaptive needs data.channel_combinations: the channel-adaptive "
                              "model is evaluated on each of them (e.g. --set data.channel_combinations=01234,0,3)")

    def check_channel_adaptive(self) -> None:
        """The channel-adaptive model trains on data.channels, so it can be evaluated only on subsets
        of them (checked on the whole run's config: a combination's step has its channels as data.channels)."""
        if not self.compare_channel_adaptive:
            return
        outside = [c for c in self.channel_combinations if not set(c) <= set(self.channels)]
        if outside:
            raise ConfigError(f"data.compare_channel_adaptive: the channel-adaptive model trains on data.channels="
                              f"{self.channels!r}, so it cannot be evaluated on {', '.join(map(repr, outside))} "
                              "(data.channel_combinations): add those channels to data.channels or drop the combinations")

    def for_combination(self, combination: str) -> "DataConfig":
        """This data config training on `combination`: its channels, named as data.channel_names
        names them (ch<digit> for a channel outside data.channels)."""
        names = dict(zip(self.channels, self.channel_names))
        chosen = tuple(names.get(c, f"ch{c}") for c in combination) if self.channel_names else ()
        return dataclasses.replace(self, channels=combination, channel_names=chosen)

    @property
    def channel_indices(self) -> tuple[int, ...]:
        return tuple(int(c) for c in self.channels)

    @property
    def in_chans(self) -> int:
        return len(self.channels)

    @property
    def per_image_normalization(self) -> bool:
        return self.normalization == "per_image"


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
    information there, not nuisance)."""

    def __post_init__(self) -> None:
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
    """auto: bf16 where the GPU supports it, fp16 with a gradient scaler otherwise, fp32 on CPU."""
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
class EvalConfig:
    knn_k: tuple[int, ...] = (5, 10, 50, 100, 200, 500)
    """Neighbour counts of the global kNN (scDINO)."""
    knn_temperature: float = 0.1
    """Temperature T of the weighted vote exp(sim / T)."""
    knn_train_fraction: float = 0.8
    """Seeded split of the held-out set into kNN reference and query images."""
    knn_whiten: bool = False
    """Whiten the features before the kNN (training/eval/knn.py `whiten`: the reference rows'
    Ledoit-Wolf covariance, no labels). Off: scDINO's kNN. On, every feature tag of the run is
    whitened alike; on the synthetic sets it raised kNN top-1 in 34 of 36 cases measured, a bag of
    channels' concatenated features the most (docs/performance.md)."""
    batch_size: int = 64
    """Images per forward pass when extracting features."""
    image_size: int = 224
    """Side the held-out images are resized to for feature extraction."""
    resize: Literal["square_bicubic", "shorter_side_bilinear", "none"] = "square_bicubic"
    """How: "square_bicubic" to image_size x image_size (every image batches with every other);
    "shorter_side_bilinear" is scDINO's Resize(image_size): the shorter side to image_size, aspect
    kept, bilinear, no antialias; "none" keeps the images' own size (scDINO's resize: False). The
    last two batch images together only when all have one shape, else one image per forward pass
    (scDINO cannot batch them at all)."""
    normalize: bool = True
    """Normalise with the dataset's per-channel mean and std before the encoder (scDINO's
    compute_cls_features.normalize); false feeds the min-max scaled images."""
    feature: Literal["cls", "cls_patch_mean"] = "cls"
    """What of the backbone's output a cell's feature is: "cls", the class token after the final norm
    (scDINO's compute_cls_features); "cls_patch_mean", that token and the mean of the patch tokens
    side by side, as DINO's linear evaluation pools them (twice the width; plain ViTs only)."""
    checkpoint_key: Literal["teacher", "student"] = "teacher"
    """Which network of a DINO/scDINO checkpoint the features (and plots) use."""
    checkpoints_dir: str = ""
    """A folder of checkpoints (*.pth) to evaluate instead of the run's own, e.g. an scDINO run's
    scDINO_ViTs/<model> folder (scDINO's only_downstream_analyses.yaml `pretrained_weights`)."""
    linear_epochs: int = 50
    """Epochs of the linear probe."""
    linear_lr: float = 0.01
    """Learning rate of the linear probe."""
    umap_neighbors: int = 30
    """UMAP n_neighbors."""
    umap_min_dist: float = 0.4
    """UMAP min_dist."""
    attention_images_per_class: int = 1
    """Images per class drawn in the attention-map plots."""
    raw_pixels_size: int = 16
    """Side the images are average-pooled to for the raw-pixel kNN baseline (keeps C*S*S modest)."""
    finetune_epochs: int = 10
    """Epochs of `linear --finetune` (backbone and head trained together); a pretrained backbone
    needs few, and each costs a full forward and backward pass over the reference images."""
    finetune_lr: float = 0.001
    """Peak AdamW learning rate of the new linear head, decayed to 0 by a per-step cosine. Not
    rescaled with the number of ranks, so figures from different world sizes stay comparable."""
    finetune_backbone_lr_scale: float = 0.1
    """Backbone learning rate = finetune_lr x this. The pretrained features should move less than
    the randomly initialised head, or its first noisy gradients wash them out; 1 treats both alike."""
    finetune_batch_size: int = 32
    """Images per rank per step of fine-tuning (the global batch is this x the world size); smaller
    than eval.batch_size because the backward pass keeps every block's activations."""
    finetune_weight_decay: float = 0.05
    """AdamW weight decay of the weight matrices (biases, norms, tokens and position embedding are
    not decayed), to keep a few hundred labelled images from being memorised."""
    finetune_flips: bool = True
    """Random horizontal and vertical flips of the training images: cells have no orientation, so
    the label holds, and it is the only augmentation (crops could cut off what defines the class)."""
    max_cells: int = 20000
    """The most held-out cells that each epoch's features, kNN, the linear probe and the plots use:
    above it, a seeded sample stratified by label (so evaluation costs the same at 10^4 and 10^7
    cells); 0 uses every held-out cell."""
    umap_max_points: int = 10000
    """The most points of a UMAP plot (a seeded sample of the evaluated cells above it)."""
    embed_all_cells: bool = True
    """Features of the final checkpoint for every cell of the dataset, training and held-out, which
    `export` writes as profiles; false: for the evaluated held-out cells only, as every epoch."""
    knn_exclude_same_batch: bool = True
    """With data.batch_column set, `knn` also scores every feature set "not same batch": a query never
    votes with a reference of its own imaging batch (the same references and queries, same-batch
    neighbours masked before the top k), reported beside the plain kNN in knn.json, knn.md, the
    comparison and the report. Batches otherwise make any representation look better than it is.
    False, or no data.batch_column: the plain kNN only."""
    plate_column: str = ""
    """The per-cell table's column naming each cell's plate, for per-well profiles (`export`) and
    retrieval mAP (`knn`). Empty: Metadata_Plate where the table has it, else no per-well profiles."""
    well_column: str = ""
    """The column naming each cell's well within its plate. Empty: Metadata_Well where the table has it."""
    profile_normalization: tuple[Literal["none", "mad_robustize", "spherize", "harmony"], ...] = ()
    """How per-well profiles are normalised before retrieval mAP compares them (and `export` writes a
    normalised copy), steps in this order (training/eval/profiles/normalization.py): "mad_robustize",
    each plate's wells against the median and MAD of its control wells (pycytominer); "spherize", ZCA
    sphering fitted on the control wells (pycytominer's Spherize), which turns the controls' spread,
    the batch effect among it, into unit variance in every direction; "harmony", Harmony (harmonypy)
    on data.batch_column. The first two need data.control_column and data.control_value. Empty or
    "none": the raw medians. A screen's usual choice: [mad_robustize, spherize]."""
    mad_robustize_samples: Literal["controls", "all"] = "controls"
    """Which of a plate's wells its median and MAD come from in eval.profile_normalization's
    mad_robustize: "controls" (pycytominer's samples="<control query>"), or "all" of the plate's wells
    (samples="all"), steadier on plates with few control wells: on the synthetic screen's 8 DMSO wells a
    plate, the trained model's activity mAP was 0.774 with "controls" and 0.926 with "all"."""
    perturbation_column: str = ""
    """The column naming each well's perturbation (compound, gene, treatment), whose replicate wells
    phenotypic-activity mAP retrieves against the control wells. Empty: data.label_column (the kNN
    classes), else the class folder."""
    activity_negatives: Literal["same_plate", "all"] = "same_plate"
    """Which control wells a perturbation's wells are retrieved against in phenotypic activity:
    "same_plate", those of the query's own plate (JUMP's setup, which keeps plate effects out of the
    comparison); "all", every control well of the screen (copairs' one-plate example), for plates
    with few controls each once per-plate normalisation (mad_robustize) has put every plate on its
    controls' scale: with 4 control wells, a perturbation's mAP can hardly reach significance."""
    consistency_column: str = ""
    """A column grouping perturbations that should look alike (a mechanism of action or target, e.g.
    Metadata_MOA): `knn` then also scores phenotypic consistency, the mAP with which the wells of one
    active perturbation retrieve those of the others in its group. Empty: no consistency mAP."""
    umap_color_columns: tuple[str, ...] = ()
    """Metadata columns (with or without the Metadata_ prefix) that colour extra UMAPs of the trained
    model and both baselines, besides the label. Empty: data.batch_column when it is set."""

    def __post_init__(self) -> None:
        self._check_profile_normalization()
        if not self.knn_k or min(self.knn_k) < 1:
            raise ConfigError(f"eval.knn_k must be a non-empty list of positive ints, got {self.knn_k}")
        _check_fraction("eval.knn_train_fraction", self.knn_train_fraction, allow_zero=False)
        if self.raw_pixels_size < 1:
            raise ConfigError(f"eval.raw_pixels_size must be >= 1, got {self.raw_pixels_size}")
        if self.max_cells < 0 or self.umap_max_points < 1:
            raise ConfigError(f"eval.max_cells must be >= 0 (0: every held-out cell) and eval.umap_max_points "
                              f">= 1, got {self.max_cells} and {self.umap_max_points}")
        self._check_finetune()

    def _check_profile_normalization(self) -> None:
        """"none" means no step (an older config's single string is a list of one); the rest run in
        one order, each once."""
        steps = tuple(s for s in self.profile_normalization if s != "none")
        if "none" in self.profile_normalization and steps:
            raise ConfigError(f"eval.profile_normalization lists 'none' with steps {list(steps)}: give the steps alone")
        order = ("mad_robustize", "spherize", "harmony")
        if len(set(steps)) != len(steps) or list(steps) != sorted(steps, key=order.index):
            raise ConfigError(f"eval.profile_normalization must list distinct steps in the order they run "
                              f"({', '.join(order)}), got {list(steps)}")
        object.__setattr__(self, "profile_normalization", steps)

    def _check_finetune(self) -> None:
        for key in ("finetune_epochs", "finetune_batch_size"):
            if getattr(self, key) < 1:
                raise ConfigError(f"eval.{key} must be >= 1, got {getattr(self, key)}")
        if self.finetune_lr <= 0:
            raise ConfigError(f"eval.finetune_lr must be > 0, got {self.finetune_lr}")
        if not 0 < self.finetune_backbone_lr_scale <= 1:
            raise ConfigError(f"eval.finetune_backbone_lr_scale must be in (0, 1] (the backbone learns no "
                              f"faster than the head), got {self.finetune_backbone_lr_scale}")
        if self.finetune_weight_decay < 0:
            raise ConfigError(f"eval.finetune_weight_decay must be >= 0, got {self.finetune_weight_decay}")


@dataclass(frozen=True)
class IngestConfig:
    """`ingest`: single cells cut out of whole fields of view, instead of `prepare`'s folder of crops."""

    table: str = ""
    """The load table (CSV or Parquet), one row per field of view in CellProfiler's LoadData naming:
    FileName_<Channel> + PathName_<Channel> per image file (PathName_ relative to the table's folder
    or absolute), ObjectsFileName_<Objects> + ObjectsPathName_<Objects> for a label mask; every other
    column is metadata carried to each cell. Set, `slurm/submit_pipeline.sh` starts the chain with
    `ingest` instead of `prepare`. Empty: no ingest (class folders, `prepare`)."""
    channels: tuple[str, ...] = ()
    """The image columns' names (<Channel> of FileName_<Channel>) in the order their channels are
    stacked, e.g. [DNA, ER, RNA, AGP, Mito]; a file holding several channels gives them all in
    place. Empty: every FileName_ column in the table's order (one multi-channel file per row is then
    its single FileName_ column)."""
    objects: str = ""
    """The LoadData objects name whose label masks segment the cells (ObjectsFileName_<objects>),
    e.g. Cells. Empty: the table's one ObjectsFileName_ column, if it has exactly one."""
    centres: str = ""
    """A per-object table (CSV or Parquet) of object centres instead of label masks, in
    CellProfiler's naming: Location_Center_X/Y or AreaShape_Center_X/Y (x the column, y the row,
    0-based), optionally ObjectNumber and AreaShape_Area; linked to the fields by ImageNumber, else
    by the Metadata_ columns both tables share. Without masks there is no area unless the table has
    AreaShape_Area, and no other cell to mask out."""
    crop_size: int = 0
    """Side in pixels of the square crop cut around each object's centroid. 0: `ingest` stops and
    proposes one from the objects' sizes (also `ingest --propose-crop-size`)."""
    edge: Literal["skip", "pad"] = "skip"
    """An object whose crop would leave the field: "skip" it (counted as window_leaves_field), or
    "pad" the part outside with zeros, so that cells at the border are kept, each less complete."""
    min_area: int = 0
    """Objects of fewer pixels are skipped and counted (debris, fragments); 0: no lower bound."""
    max_area: int = 0
    """Objects of more pixels are skipped and counted (clumps, segmentation failures); 0: no upper bound."""
    mask_other_cells: bool = False
    """Set the pixels of every other object in a crop to 0, so that a crop shows one cell and the
    background around it; needs label masks."""
    cellprofiler: bool = False
    """Also measure every cut cell as CellProfiler does (the cp_measure library: intensity, texture,
    size and shape, ... of each channel inside the cell's own mask), stored beside the cells, so that
    `features` evaluates them as the "cellprofiler" baseline next to raw pixels and random init: the
    features a lab already trusts. Needs label masks (ingest.objects), not a table of centres."""

    def __post_init__(self) -> None:
        if self.crop_size < 0 or self.crop_size == 1:
            raise ConfigError(f"ingest.crop_size must be >= 2 pixels (0: propose one), got {self.crop_size}")
        if self.min_area < 0 or self.max_area < 0:
            raise ConfigError(f"ingest.min_area and ingest.max_area must be >= 0 pixels (0: no bound), got "
                              f"{self.min_area} and {self.max_area}")
        if self.max_area and self.min_area > self.max_area:
            raise ConfigError(f"ingest.min_area ({self.min_area}) is above ingest.max_area ({self.max_area})")
        if len(set(self.channels)) != len(self.channels) or not all(self.channels):
            raise ConfigError(f"ingest.channels must name distinct image columns, got {list(self.channels)}")
        if self.objects and self.centres:
            raise ConfigError("ingest.objects (label masks) and ingest.centres (a table of centres) are two ways to "
                              f"find the cells: set one, got {self.objects!r} and {self.centres!r}")
        if self.centres and self.cellprofiler:
            raise ConfigError("ingest.cellprofiler measures each cell inside its label mask, and ingest.centres gives "
                              "only centres: set cellprofiler: false, or give label masks (ingest.objects)")
        if self.centres and self.mask_other_cells:
            raise ConfigError("ingest.mask_other_cells needs label masks (ingest.objects), and ingest.centres gives "
                              "only centres: set mask_other_cells: false")


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


def _check_fraction(key: str, value: float, *, allow_zero: bool) -> None:
    low_ok = value >= 0 if allow_zero else value > 0
    if not (low_ok and value < 1 or (not allow_zero and value == 1)):
        bound = "[0, 1)" if allow_zero else "(0, 1]"
        raise ConfigError(f"{key} must be in {bound}, got {value}")


def _to_plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_plain(v) for v in value]
    return value


def flatten_dotted(tree: dict[str, Any], prefix: str = "", keep: tuple[str, ...] = ()) -> dict[str, Any]:
    """{"section.key": value} from a nested mapping; a mapping whose dotted path is in `keep` stays a value."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and dotted not in keep:
            flat.update(flatten_dotted(value, dotted + ".", keep))
        else:
            flat[dotted] = value
    return flat


def set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Set tree["a"]["b"] = value for "a.b", adding a missing section of the schema (a tree from a
    YAML file need not have every section); an unknown section is an error naming the allowed ones."""
    *parents, leaf = dotted.split(".")
    node, hint = tree, Config
    for part in parents:
        fields = typing.get_type_hints(hint) if dataclasses.is_dataclass(hint) else {}
        hint = fields.get(part)
        if node.get(part) is None and dataclasses.is_dataclass(hint):
            node[part] = {}
        if not isinstance(node.get(part), dict):
            raise ConfigError(f"unknown config section {dotted!r}: {_suggest(part, fields or node)}")
        node = node[part]
    node[leaf] = value


def hint_of(dotted: str) -> Any:
    """The declared type of a dotted config key, or None for an unknown key."""
    hint: Any = Config
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(hint):
            return None
        hint = typing.get_type_hints(hint).get(part)
    return hint


def _suggest(key: str, allowed: typing.Iterable[str]) -> str:
    allowed = sorted(allowed)
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"{hint}allowed: {', '.join(allowed)}"


def _coerce(key: str, value: Any, hint: Any) -> Any:
    origin = get_origin(hint)
    if origin is Literal:
        choices = get_args(hint)
        if value not in choices:
            raise ConfigError(f"{key} must be one of {', '.join(map(repr, choices))}; got {value!r}")
        return value
    if origin is tuple:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        args = get_args(hint)
        item_hints = [args[0]] * len(value) if len(args) == 2 and args[1] is Ellipsis else list(args)
        if len(item_hints) != len(value):
            raise ConfigError(f"{key} must have {len(item_hints)} items, got {len(value)}")
        return tuple(_coerce(f"{key}[{i}]", v, h) for i, (v, h) in enumerate(zip(value, item_hints)))
    if hint is bool:
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ConfigError(f"{key} must be an integer, got {value!r}")
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"{key} must be an integer, got {value!r}") from None
    if hint is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key} must be a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key} must be a number, got {value!r}") from None
    if hint is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{key} must be a string, got {value!r}")
        if key.startswith(("data.channels", "data.channel_combinations[")) and isinstance(value, int):
            # YAML reads 01234 as the octal number 668 and 012 as 10: the digits are already lost
            example = "channels: \"01234\"" if key == "data.channels" else "channel_combinations: [\"01234\", \"0\"]"
            raise ConfigError(f"{key} must be quoted, e.g. {example} (unquoted, YAML reads "
                              f"the digits as a number: {value!r})")
        return "" if value is None else str(value)
    return value


def _build(cls: type, data: Any, prefix: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'the config'} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        key = sorted(unknown)[0]
        raise ConfigError(f"unknown config key {prefix + key!r}: {_suggest(key, names)}")
    kwargs = {}
    for name in names & set(data):
        hint = hints[name]
        key = prefix + name
        if dataclasses.is_dataclass(hint):
            kwargs[name] = _build(hint, data[name], key + ".")
        else:
            kwargs[name] = _coerce(key, data[name], hint)
    return cls(**kwargs)


def from_dict(data: dict[str, Any]) -> Config:
    """Build and validate a Config from a plain nested mapping."""
    return _build(Config, data, "")
