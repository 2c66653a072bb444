"""The model card: what a trained model expects of the images it embeds, and where it came from.

One record travels with the weights, so that a model trained on a pilot screen can be used on every
plate that follows without guessing how it was fed:

    channels, channel_ids   the channels' names in the model's input order, and each one's index in
                            the training images (data.channels)
    mean, std               per channel in that order: the run's mean_std.json, over pixels min-max
                            scaled per image and channel first (scDINO's scaling, `min_max_scaling`)
    normalization           data.normalization ("dataset": minus mean, over std; "per_image")
    crop_size               side of the cells it learnt from (ingest.crop_size; for class folders the
                            packed images' side; 0 when they vary), beside patch_size, the DINO crops
                            and the evaluation's image size, resize and feature
    provenance              the training screen: data.source, the LoadData table and its SHA-256, the
                            packed dataset's index SHA-256 (it holds the CRC-32 of every pixel file
                            and of the per-cell table), the synthetic screen's seed, cells, plates, batches
    recipe                  arch, kind, epochs configured and done, the global step, the resolved
                            config's SHA-256

Where it is written: every checkpoint ("model_card", training/checkpointing.py), each feature set
computed from a checkpoint (features/<tag>/index.json), and the exported profiles (cells.h5ad
uns["scdino"]["model_card"], the Parquet files' schema metadata under PARQUET_KEY). `python -m training profile`
reads it to embed a new screen as the model learnt (training/steps/profile.py) and to refuse one it
does not fit: a channel missing, another crop size, per-channel statistics outside STATS_FACTOR.

A checkpoint saved before cards existed has none: `card_of_checkpoint` rebuilds one from the config
it holds and its run's files, with a note saying so; weights from elsewhere (DINO, scDINO) have no card.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.config import Config
from training.errors import UserError

log = logging.getLogger(__name__)

CARD_VERSION = 1
"""Bumped when a field changes meaning; a reader refuses a card newer than it knows."""
MIN_MAX_SCALING = "per image and channel: (x - min) / (max - min), before mean and std"
"""scDINO's input scaling, which every loader here applies before data.normalization."""
STATS_FACTOR = 1.5
"""How far a new screen's per-channel mean and std (over min-max scaled pixels, as mean-std computes
them) may lie from the card's, as a ratio either way. Measured against `make screen`'s card (seed 0):
synthetic screens of seeds 1 to 6, imaging batch strengths 0 to 3 and fields of 128 to 256 px lie
within 1.34 (the most at batch strength 3); with DNA and Membrane named the other way round, the DNA
channel's statistics lie 1.89 to 2.41 away (DNA's mean is about half the other stains'). 1.5 lets the
first through and refuses the second. Within it, the model's own mean and std normalise the new cells
off centre by at most half the mean, 0.43 of a training std on that card."""
PARQUET_KEY = b"scdino.model_card"
"""The Parquet schema-metadata key of the card, as JSON (pyarrow: `schema.metadata[PARQUET_KEY]`)."""


@dataclass(frozen=True)
class Provenance:
    """The screen (or folder of cells) the model trained on."""

    source: str = ""
    """data.source of the training run."""
    table: str = ""
    """ingest.table: the LoadData table its cells were cut from ("" for class folders)."""
    table_sha256: str = ""
    """SHA-256 of the table file's bytes ("" when there is none, or it could not be read)."""
    packed_sha256: str = ""
    """SHA-256 of the packed dataset's index.json, which records every pixel file's and the per-cell
    table's CRC-32: the same hash means the same cells."""
    generator_seed: int | None = None
    """The seed of a synthetic screen (its screen.json beside the table); None for real data."""
    cells: int = 0
    plates: tuple[str, ...] = ()
    """Values of the plate column (eval.plate_column, else Metadata_Plate), sorted."""
    batches: tuple[str, ...] = ()
    """Values of data.batch_column (else Metadata_Batch), sorted."""


@dataclass(frozen=True)
class Recipe:
    """How the weights were made."""

    run: str = ""
    arch: str = ""
    kind: str = "vit"
    seed: int = 0
    epochs: int = 0
    """optim.epochs: what the run was set to train."""
    epochs_done: int = 0
    global_step: int = 0
    config_sha256: str = ""
    """SHA-256 of the resolved config as sorted JSON: two cards with the same hash had the same settings."""


@dataclass(frozen=True)
class ModelCard:
    channels: tuple[str, ...]
    channel_ids: tuple[int, ...]
    mean: tuple[float, ...] = ()
    """Per channel of `channels`; empty when the run had no mean_std.json."""
    std: tuple[float, ...] = ()
    normalization: str = "dataset"
    eval_normalize: bool = True
    """eval.normalize: false feeds the min-max scaled images to the encoder unnormalised."""
    crop_size: int = 0
    patch_size: int = 16
    global_crop_size: int = 224
    local_crop_size: int = 96
    eval_image_size: int = 224
    eval_resize: str = "square_bicubic"
    eval_tta: str = "none"
    """eval.tta: "dihedral" averages each cell's features over its 8 orientations (none on older cards)."""
    feature: str = "cls"
    provenance: Provenance = field(default_factory=Provenance)
    recipe: Recipe = field(default_factory=Recipe)
    min_max_scaling: str = MIN_MAX_SCALING
    notes: tuple[str, ...] = ()
    """How the card was made when not by the run that saved the weights."""
    version: int = CARD_VERSION

    def to_dict(self) -> dict[str, Any]:
        return _plain(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: object = "the model card") -> ModelCard:
        """The card of `to_dict`; a UserError of one line when it is not one, or newer than this code."""
        if not isinstance(data, dict) or "channels" not in data:
            raise UserError(f"{where} is not a model card (no channels): it was not written by this package")
        version = data.get("version", CARD_VERSION)
        if not isinstance(version, int) or version > CARD_VERSION:
            raise UserError(f"{where} is a model card of version {version}, newer than this code reads "
                            f"({CARD_VERSION}): update the training package")
        try:
            nested = {"provenance": Provenance(**_tuples(data.get("provenance", {}))),
                      "recipe": Recipe(**data.get("recipe", {}))}
            known = {f.name for f in dataclasses.fields(cls)} - set(nested)
            return cls(**{k: v for k, v in _tuples(data).items() if k in known}, **nested)
        except TypeError as exc:
            raise UserError(f"{where} is not a model card this code reads ({exc})") from None

    def at(self, epoch: int, global_step: int) -> ModelCard:
        """This card for weights saved after `epoch` completed epochs and `global_step` steps."""
        return dataclasses.replace(self, recipe=dataclasses.replace(self.recipe, epochs_done=int(epoch),
                                                                    global_step=int(global_step)))

    def differences(self, other: ModelCard) -> list[str]:
        """The fields in which `other` is not these weights (recipe: run, config hash, step; provenance:
        the training screen) reading the same inputs the same way (channels, statistics, crop, the
        evaluation's settings); [] when their features are one space."""
        mine, theirs = self.to_dict(), other.to_dict()
        return [key for key in mine if key not in ("notes", "version") and mine[key] != theirs.get(key)]

    def describe(self) -> str:
        """The weights in a few words: run, architecture, step and config hash."""
        recipe = self.recipe
        return (f"run {recipe.run or '?'} ({recipe.arch or '?'}, step {recipe.global_step}, config "
                f"{recipe.config_sha256[:12] or '?'})")

    def channel_order(self, available: dict[str, int]) -> tuple[int, ...]:
        """The index, among a screen's channels (`available`: name -> index), of each channel the model
        reads, in the model's order; a UserError of one line when the screen lacks one."""
        missing = [name for name in self.channels if name not in available]
        if missing:
            raise UserError(f"the new screen lacks channel{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                            f"of the model (it reads {', '.join(self.channels)}, in that order; the screen has "
                            f"{', '.join(available) or 'none'}): name the screen's channels as the model's card "
                            "does with data.channel_names")
        return tuple(available[name] for name in self.channels)

    def statistics_problems(self, mean: list[float], std: list[float]) -> list[str]:
        """Each channel whose mean or std (in the model's order) lies outside STATS_FACTOR of the card's,
        as "DNA: mean 0.180 is 1.94x the model's 0.093"; [] when all fit or the card has no statistics."""
        problems = []
        for name, *pairs in zip(self.channels, zip(mean, self.mean), zip(std, self.std)):
            for what, (new, trained) in zip(("mean", "std"), pairs):
                ratio = _ratio(new, trained)
                if ratio > STATS_FACTOR:
                    problems.append(f"{name}: {what} {new:.3g} is {ratio:.2f}x {'above' if new > trained else 'below'} "
                                    f"the model's {trained:.3g}")
        return problems


def _ratio(a: float, b: float) -> float:
    """max(a/b, b/a) of two non-negative numbers; infinite when one is 0 and the other is not."""
    low, high = sorted((float(a), float(b)))
    if high == 0:
        return 1.0
    return high / low if low > 0 else float("inf")


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _tuples(data: dict[str, Any]) -> dict[str, Any]:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}


def config_sha256(tree: dict[str, Any]) -> str:
    """The SHA-256 of a resolved config (Config.to_dict(), as a checkpoint holds it) as sorted JSON."""
    return hashlib.sha256(json.dumps(tree, sort_keys=True).encode()).hexdigest()


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, "" when it cannot be read."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return ""
    return digest.hexdigest()


def build_card(config: Config, *, epoch: int = 0, global_step: int = 0) -> ModelCard:
    """The card of a run's model, from its config and the files its data steps wrote (mean_std.json,
    the packed dataset); what cannot be read is left empty, with a note: a card never stops training."""
    notes: list[str] = []
    mean, std = _statistics(config, notes)
    images = _packed(config, notes)
    card = ModelCard(
        channels=tuple(config.data.channel_names) or tuple(f"ch{c}" for c in config.data.channels),
        channel_ids=config.data.channel_indices, mean=mean, std=std, normalization=config.data.normalization,
        eval_normalize=config.eval.normalize, crop_size=_crop_size(config, images),
        patch_size=config.model.patch_size, global_crop_size=config.dino.global_crop_size,
        local_crop_size=config.dino.local_crop_size, eval_image_size=config.eval.image_size,
        eval_resize=config.eval.resize, eval_tta=config.eval.tta, feature=config.eval.feature,
        provenance=_provenance(config, images, notes),
        recipe=Recipe(run=config.run.name, arch=config.model.arch, kind=config.model.kind, seed=config.run.seed,
                      epochs=config.optim.epochs, config_sha256=config_sha256(config.to_dict())),
        notes=tuple(notes))
    return card.at(epoch, global_step)


def _statistics(config: Config, notes: list[str]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    from training.data.stats import load_mean_std

    try:
        mean, std = load_mean_std(config)
    except UserError as exc:
        notes.append(f"no per-channel statistics: {exc}")
        return (), ()
    return tuple(mean), tuple(std)


def _packed(config: Config, notes: list[str]):
    """The run's packed dataset, None for a folder of TIFFs or one that cannot be opened."""
    from training.data.dataset import resolve_source
    from training.data.store.read import PackedImages

    try:
        kind, folder = resolve_source(config)
        return PackedImages(folder, label_column="", batch_column="") if kind == "packed" else None
    except UserError as exc:
        notes.append(f"no packed dataset to describe: {exc}")
        return None


def _crop_size(config: Config, images) -> int:
    if config.ingest.table:
        return config.ingest.crop_size
    shape = getattr(images, "uniform_shape", None)
    return int(shape[-1]) if shape and shape[-1] == shape[-2] else 0


def _provenance(config: Config, images, notes: list[str]) -> Provenance:
    from training.data.store.format import INDEX_FILE

    table = Path(config.ingest.table) if config.ingest.table else None
    seed = None
    if table is not None and (table.parent / "screen.json").is_file():  # the synthetic screen's parameters
        try:
            seed = json.loads((table.parent / "screen.json").read_text()).get("seed")
        except (OSError, ValueError, AttributeError):
            seed = None
    values: dict[str, tuple[str, ...]] = {}
    if images is not None:
        columns = images.table.columns
        for key, wanted in (("plates", config.eval.plate_column or "Metadata_Plate"),
                            ("batches", config.data.batch_column or "Metadata_Batch")):
            name = next((c for c in (wanted, f"Metadata_{wanted}") if c in columns), None)
            try:
                values[key] = tuple(images.table.categories(name).names) if name else ()
            except UserError as exc:  # a damaged column: the steps that read it say so, not the card
                notes.append(f"no {key}: {exc}")
    return Provenance(
        source=config.data.source, table=str(table or ""), table_sha256=file_sha256(table) if table else "",
        packed_sha256=file_sha256(images.folder / INDEX_FILE) if images is not None else "",
        generator_seed=seed if isinstance(seed, int) else None, cells=len(images) if images is not None else 0,
        **values)


def card_of_checkpoint(saved: dict[str, Any], path: Path) -> ModelCard | None:
    """The card a checkpoint holds; for one saved before cards, one rebuilt from its config and its run's
    files (with a note, logged); None for weights from elsewhere, which hold no config of ours."""
    if isinstance(saved.get("model_card"), dict):
        return ModelCard.from_dict(saved["model_card"], f"{path}'s model card")
    if not isinstance(saved.get("config"), dict):
        log.info("%s holds no model card (weights from elsewhere): nothing says how its inputs were made", path)
        return None
    from training.config import from_dict

    try:
        config = _at_its_run(from_dict(saved["config"]), Path(path))
    except UserError as exc:
        log.warning("%s holds no model card, and its config no longer loads (%s): no card", path, exc)
        return None
    note = (f"rebuilt when read from {Path(path).name}, saved before model cards: from its config and the "
            "run's files as they are now")
    log.warning("%s was saved before model cards: its card is rebuilt from its config and its run's files", path)
    card = build_card(config, epoch=int(saved.get("epoch", 0)), global_step=int(saved.get("global_step", 0)))
    recipe = dataclasses.replace(card.recipe, config_sha256=config_sha256(saved["config"]))  # as saved, not as read now
    return dataclasses.replace(card, recipe=recipe, notes=(note, *card.notes))


def _at_its_run(config: Config, path: Path) -> Config:
    """The config with run.output_dir where the checkpoint lies, when it lies in a run's checkpoints
    folder elsewhere than the config says (a run copied or moved since, or read from another folder)."""
    from training.rundir.layout import checkpoint_role

    if checkpoint_role(path) is None or config.run.combination or config.run.channel_adaptive:
        return config
    root = path.parent.parent
    if Path(config.run.output_dir).resolve() == root.resolve():
        return config
    return config.replace({"run.output_dir": str(root)})


def read_card(path: Path) -> ModelCard | None:
    """The card of a checkpoint file (memory-mapped: its weights are not read); see card_of_checkpoint."""
    from training.rundir.artifacts import read_checkpoint

    return card_of_checkpoint(read_checkpoint(Path(path), mmap_weights=True, verify=False), Path(path))
