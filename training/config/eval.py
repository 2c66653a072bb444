"""The `eval:` section: features, kNN, the linear probe, fine-tuning and well profiles."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from training.config.validation import ConfigError, check_fraction


@dataclass(frozen=True)
class EvalConfig:
    knn_k: tuple[int, ...] = (5, 10, 50, 100, 200, 500)
    """Neighbour counts of the global kNN (scDINO)."""
    knn_temperature: float = 0.1
    """Temperature T of the weighted vote exp(sim / T)."""
    knn_train_fraction: float = 0.8
    """Seeded split of the held-out set into kNN reference and query images."""
    knn_folds: int = 1
    """Which held-out images the kNN queries. 1: scDINO's one seeded split (knn_train_fraction of them
    references, the rest queries). n > 1: n stratified folds, each fold's images queried against the
    other folds' (a reference share of (n - 1) / n), the votes pooled, so every held-out image is a
    query once. On a screen of 865 held-out cells the one split scores 172 queries, whose accuracy has
    a standard error near 4 points; 5 folds score all 865 (about 1.7). The linear probe and
    fine-tuning keep the one split."""
    knn_whiten: bool = False
    """Whiten the features before the kNN (training/eval/knn.py `whiten`: the reference rows'
    Ledoit-Wolf covariance, no labels). Off: scDINO's kNN. On, every feature tag of the run is
    whitened alike; on the synthetic sets it raised kNN top-1 in 34 of 36 cases measured, a bag of
    channels' concatenated features the most (docs/performance.md)."""
    batch_size: int = 64
    """Images per forward pass when extracting features."""
    image_size: int = 224
    """Side the held-out images are resized to for feature extraction."""
    resize: Literal["square_bicubic", "shorter_side_bilinear", "none", "centre_crop"] = "square_bicubic"
    """How: "square_bicubic" to image_size x image_size (every image batches with every other);
    "centre_crop", the central image_size x image_size window at the crop's own resolution, as DINO's
    evaluation crops the centre (an image smaller than that is first brought up to it): no pixel is
    resampled, so puncta and edges stay as imaged, and the model sees as many patches as its global
    crops had;
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
    tta: Literal["none", "dihedral"] = "none"
    """Test-time augmentation of the final model's features: "dihedral" encodes each cell in its 8
    orientations (4 quarter turns, each mirrored) and averages the features, as a cell has no
    orientation and its profile should not have one either. It costs 8 forward passes a cell, so it
    reads the final checkpoint only (features/final: the profiles, export and the run's figures);
    the numbered epochs' curves and the baselines read each cell once. On make screen's screen the
    features step took 311 s with every model read 8 times and 81 s read once (loaded machine)."""
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
    profile_cells: Literal["evaluated", "all"] = "evaluated"
    """The cells whose per-well profiles retrieval mAP (`knn`) scores: "evaluated", the held-out cells
    the kNN reads; "all", every cell of the dataset, as `export`'s profiles and a lab's are (the model
    never sees a perturbation or a label, so profiling the cells it trained on leaks nothing). "all"
    needs eval.embed_all_cells, and `features` then computes the baselines on every cell too (a
    forward pass of the random-init model over the dataset); a numbered epoch's features cover the
    evaluated cells only, so its mAP stays on those, and knn.json says which cells each tag's mAP read.
    On make screen's screen, all 1,727 cells instead of 865 lifted every feature set's mAP (the model's
    consistency 0.662 -> 0.770, CellProfiler's 0.734 -> 0.807)."""
    profile_aggregation: Literal["median", "mean"] = "median"
    """How a well's cells make its profile, for retrieval mAP (`knn`) and `export`'s per-well
    profiles: "median", each feature's median over the well's cells (pycytominer's default), or
    "mean" (pycytominer's aggregate operation "mean"). The median ignores a well's odd cells; the
    mean keeps how many cells of a well show a phenotype, which is what a compound's phenotype is when
    only some of its cells respond. bench screen counts each baseline at its better of the two."""
    profile_subpopulations: int = 0
    """Also profile each well by the share of its cells in this many subpopulations of the profiled
    cells (k-means on their L2-normalised features; Slack et al., PNAS 2008), set beside the
    normalised mean or median profile for retrieval mAP (training/eval/profiles/subpopulations.py):
    a compound that changes some of a well's cells moves its shares more than its mean. 0: the
    profile alone. bench screen then also reads every feature set without the shares, and counts
    each baseline at its better."""
    profile_subpopulation_centres: str = ""
    """A run's profiles/subpopulations.parquet (which `export` writes): count the cells in those
    subpopulations instead of fitting k-means on this screen's, so that the shares of new plates
    compare with the pilot's, well by well. Only features of the model they were fitted on (its model
    card) are counted in them: `export` refuses others in one line, retrieval mAP fits its own for a
    baseline's. `profile` sets it to the model's run's file when there is one (model_subpopulations.parquet).
    Empty: fitted on each screen."""
    profile_subpopulations_weight: float = 0.2
    """The share of a well's squared norm (on average over the wells) that its subpopulation shares
    hold beside the profile's 1 - this; in (0, 1)."""
    profile_median_beside: float = 0.0
    """The part of retrieval's cosine that the field's standard profile of each well holds: the median
    of its cells, normalised by the same steps with plain ZCA (eval.spherize_shrinkage 0) and without
    the shares, as pycytominer's defaults make it, set beside the configured profile (shares and all)
    with each block scaled to unit norm per well, so that the cosine between two wells is
    (1 - this) x their profiles' + this x their medians' (training/eval/profiles/normalization.py,
    beside_unit). 0: the configured profile alone. bench screen then also reads every feature set
    without it, and counts each baseline at its better."""
    hybrid_cellprofiler: bool = False
    """Also score the trained model's features beside CellProfiler's measurements, as labs combine
    them: each block standardised per feature over the scored cells and weighted by 1 / sqrt(its width),
    so that both weigh alike (training/eval/profiles/hybrid.py). Reported as its own row, "trained +
    CellProfiler", never as the model's; needs a dataset ingested with ingest.cellprofiler."""
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
    spherize_shrinkage: float = 0.0
    """How gently spherize whitens: each direction of the control wells' spread, of standard deviation s,
    is divided by s + this x the controls' root-mean-square standard deviation per feature, not by s
    (pycytominer's Spherize epsilon, set to match: training/eval/profiles/normalization.py
    `sphere_epsilon`). 0: plain ZCA. A screen has tens of control wells and a model hundreds of
    features, so plain ZCA stretches the controls' weakest directions, noise among them, as much as it
    shrinks their strongest; at 10 the strongest (the batch and plate effects) are still tamed and the
    weak ones keep their relative scale. On the synthetic screens that raised the trained model's
    consistency mAP at the same activity, while CellProfiler's and raw pixels' did best near 0
    (docs/performance.md, "Sphering, gently"); bench screen counts them at their better."""
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
        check_fraction("eval.knn_train_fraction", self.knn_train_fraction, allow_zero=False)
        if isinstance(self.knn_folds, bool) or not isinstance(self.knn_folds, int) or self.knn_folds < 1:
            raise ConfigError(f"eval.knn_folds must be 1 (one reference/query split) or a number of folds >= 2, "
                              f"got {self.knn_folds!r}")
        if self.raw_pixels_size < 1:
            raise ConfigError(f"eval.raw_pixels_size must be >= 1, got {self.raw_pixels_size}")
        if self.max_cells < 0 or self.umap_max_points < 1:
            raise ConfigError(f"eval.max_cells must be >= 0 (0: every held-out cell) and eval.umap_max_points "
                              f">= 1, got {self.max_cells} and {self.umap_max_points}")
        self._check_finetune()
        if isinstance(self.profile_subpopulations, bool) or not isinstance(self.profile_subpopulations, int) \
                or self.profile_subpopulations < 0 or self.profile_subpopulations == 1:
            raise ConfigError(f"eval.profile_subpopulations must be 0 (the profile alone) or a number of "
                              f"subpopulations >= 2, got {self.profile_subpopulations!r}")
        if self.profile_subpopulation_centres and not self.profile_subpopulations:
            raise ConfigError(f"eval.profile_subpopulation_centres={self.profile_subpopulation_centres} names "
                              "subpopulations to count, and eval.profile_subpopulations is 0 (no shares): set it to "
                              "the file's number of subpopulations, or clear eval.profile_subpopulation_centres")
        if not 0 < self.profile_subpopulations_weight < 1:
            raise ConfigError(f"eval.profile_subpopulations_weight must be in (0, 1) (the shares' part of a "
                              f"well's squared norm), got {self.profile_subpopulations_weight!r}")
        if isinstance(self.profile_median_beside, bool) or not 0 <= self.profile_median_beside < 1:
            raise ConfigError(f"eval.profile_median_beside must be in [0, 1) (the median profile's part of "
                              f"retrieval's cosine; 0: the profile alone), got {self.profile_median_beside!r}")
        if not self.spherize_shrinkage >= 0:
            raise ConfigError(f"eval.spherize_shrinkage must be >= 0 (0: plain ZCA), got {self.spherize_shrinkage}")
        if self.profile_cells == "all" and not self.embed_all_cells:
            raise ConfigError("eval.profile_cells: all scores the well profiles of every cell, and "
                              "eval.embed_all_cells is false, so the final features hold the evaluated cells only: "
                              "set eval.embed_all_cells: true, or eval.profile_cells: evaluated")

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

