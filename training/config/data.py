"""The `data:` section: where the images are, which channels, how they are split, normalised and loaded."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from training.config.validation import ConfigError, check_fraction


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
        check_fraction("data.holdout_fraction", self.holdout_fraction, allow_zero=True)
        check_fraction("data.mean_std_fraction", self.mean_std_fraction, allow_zero=False)
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

