"""A well's subpopulations beside its mean profile (eval.profile_subpopulations).

A compound that changes only some of a well's cells moves the well's mean little, and which of the
screen's cell states its cells fall in a lot. Slack et al. (PNAS 2008) profile a well by the share of
its cells in each subpopulation of the screen's cells; here those shares stand beside the usual
normalised profile, so that retrieval mAP reads both:

    subpopulations  k-means (scikit-learn, seeded, RESTARTS restarts) on the L2-normalised features of
                    a seeded sample of at most SAMPLE_CELLS of the profiled cells; every cell then
                    belongs to the centre nearest its L2-normalised features, as k-means assigns
    well_shares     each well's fraction of cells in each of the k subpopulations
    Centres         the k centres with the model card of the features they were fitted on: `export`
                    writes them (profiles/subpopulations.parquet), and eval.profile_subpopulation_centres
                    carries a pilot's to new plates (`profile` sets it), so that their shares count the
                    cells in the pilot's subpopulations and compare with the pilot's, well by well
    beside_shares   the shares minus the control wells' mean shares (what a well gains or loses
                    against DMSO), each block scaled so that the shares make `weight` of a well's
                    squared norm on average and the normalised profile the rest, side by side

The shares are not put through mad_robustize or sphering: a rare subpopulation's share hardly varies
among a plate's wells, and scaled to unit spread it would outweigh the rest (docs/performance.md,
"Wells by their subpopulations").
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from training.errors import UserError
from training.eval.profiles.wells import BLOCK_CELLS, Wells
from training.rundir import RunLayout

log = logging.getLogger(__name__)

CENTRES_FILE = RunLayout(Path("<run>")).profiles_subpopulations
"""Where `export` writes a run's centres, as messages name it."""

SAMPLE_CELLS = 50_000
"""The most cells k-means is fitted on (a seeded sample above it), so that 10^7 cells cost what 5 x 10^4 do."""
RESTARTS = 4
"""k-means restarts (scikit-learn's n_init): the best of four seeded initialisations."""
SUBPOPULATION_PREFIX = "Cells_scDINO_Subpopulation_"
"""wells_subpopulations.parquet's columns: a well's share of cells in each subpopulation."""
CENTRES_KEY = b"scdino.subpopulations"
"""The Parquet schema-metadata key of a centres file's record (JSON): k, dim, how they were fitted."""
NAME_COLUMN = "Metadata_Subpopulation"
CELLS_COLUMN = "Metadata_Cells"
"""A centres file's columns beside the features: each subpopulation's name (the wells file's column)
and how many of the export's cells it holds."""


def _unit_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


def subpopulations(features: np.ndarray, rows: np.ndarray, k: int, seed: int,
                   sample: int = SAMPLE_CELLS) -> np.ndarray:
    """(k, D) float32 centres of k-means on the L2-normalised `features[rows]` (a seeded sample of at
    most `sample` of them). A UserError when there are fewer cells than subpopulations."""
    from sklearn.cluster import KMeans

    rows = np.asarray(rows, np.int64)
    if k < 2:
        raise ValueError(f"subpopulations need k >= 2, got {k}")
    if len(rows) < k:
        raise UserError(f"eval.profile_subpopulations={k} asks for more subpopulations than the {len(rows)} profiled "
                        f"cells: set it to at most {len(rows)}, or 0 for the mean profile alone")
    if len(rows) > sample:
        rows = np.sort(np.random.default_rng(seed).choice(rows, size=sample, replace=False))
    fitted = KMeans(n_clusters=k, n_init=RESTARTS, random_state=seed).fit(_unit_rows(features[rows]))
    return fitted.cluster_centers_.astype(np.float32)


def nearest(features: np.ndarray, rows: np.ndarray, centres: np.ndarray, block_cells: int = BLOCK_CELLS) -> np.ndarray:
    """Each of `features[rows]`'s subpopulation: the centre nearest its L2-normalised features (in
    Euclidean distance, as k-means assigns), read `block_cells` rows at a time."""
    rows = np.asarray(rows, np.int64)
    out = np.empty(len(rows), np.int64)
    squared = np.einsum("ij,ij->i", centres, centres)
    for first in range(0, len(rows), block_cells):
        chosen = rows[first:first + block_cells]
        ascending = np.argsort(chosen, kind="stable")
        block = np.empty((len(chosen), centres.shape[1]), np.float32)
        block[ascending] = features[chosen[ascending]]
        # |x - c|^2 = |x|^2 - 2 x.c + |c|^2; |x|^2 is the same for every centre
        out[first:first + len(chosen)] = np.argmin(squared[None, :] - 2 * (_unit_rows(block) @ centres.T), axis=1)
    return out


def shares_of(features: np.ndarray, wells: Wells, centres: np.ndarray) -> np.ndarray:
    """(wells, k) float64: each well's fraction of cells nearest each of the k `centres`."""
    k = len(centres)
    members = nearest(features, wells.order, centres)
    well_of = np.repeat(np.arange(wells.count), wells.sizes)
    counts = np.bincount(well_of * k + members, minlength=wells.count * k).reshape(wells.count, k)
    return counts / wells.sizes[:, None]


def well_shares(features: np.ndarray, wells: Wells, k: int, seed: int,
                carried: Centres | None = None) -> np.ndarray:
    """(wells, k) float64: each well's fraction of cells in each of the k subpopulations of its cells'
    features (`features` positions are those `wells` groups); in `carried`'s, where given."""
    centres = carried.centres if carried is not None else subpopulations(features, wells.order, k, seed)
    return shares_of(features, wells, centres)


def controls_shift(shares: np.ndarray, pilot: np.ndarray) -> float:
    """How far one screen's control wells lie from a pilot's in the pilot's subpopulations: the total
    variation distance of their mean shares, half the L1 distance (0 the same mixture of cell states,
    1 none in common). The controls are the same treatment on every plate, so this is the drift of the
    new plates' cells (stain, imaging, cell line) as the model sees it."""
    return float(0.5 * np.abs(np.asarray(shares, np.float64) - np.asarray(pilot, np.float64)).sum())


def signatures(shares: np.ndarray, perturbations: np.ndarray, controls: np.ndarray) -> dict[str, list[float]]:
    """Each perturbation's mean shares over its wells that are not controls, less the control wells'
    mean shares: which cell states it gains or loses against the controls."""
    reference = shares[controls].mean(axis=0)
    treated = ~controls
    return {str(name): [round(float(v), 6) for v in shares[treated & (perturbations == name)].mean(axis=0) - reference]
            for name in sorted(set(perturbations[treated].tolist()), key=str)}


def against_pilot(control_shares: np.ndarray, found: dict[str, list[float]], pilot: dict[str, Any]) -> dict[str, Any]:
    """How this screen's wells read in the pilot's subpopulations beside the pilot's own (its centres
    file's record): the controls' shift (controls_shift) and, for the perturbations both screens hold,
    the cosine of each one's signature to the pilot's of the same perturbation and to the pilot's others,
    and how many find their own as the nearest of the pilot's. A screen that reproduces the pilot's
    biology in the pilot's terms gives a small shift, same-perturbation cosines near 1 and each
    perturbation nearest itself."""
    out: dict[str, Any] = {"controls_shift": round(controls_shift(control_shares, pilot["control_shares"]), 4)}
    theirs = pilot.get("signatures") or {}
    both = [name for name in found if name in theirs]
    if len(both) < 2 or len(theirs) < 2:
        return {**out, "perturbations": len(both)}
    names = list(theirs)

    def unit(rows: list[list[float]]) -> np.ndarray:
        x = np.asarray(rows, np.float64)
        norms = np.linalg.norm(x, axis=1, keepdims=True)
        return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)

    cosine = unit([found[n] for n in both]) @ unit([theirs[n] for n in names]).T
    own = np.array([names.index(n) for n in both])
    same = cosine[np.arange(len(both)), own]
    others = np.ma.masked_array(cosine, mask=np.arange(len(names))[None, :] == own[:, None])
    return {**out, "perturbations": len(both), "nearest_is_itself": int((cosine.argmax(axis=1) == own).sum()),
            "cosine_same": round(float(same.mean()), 4), "cosine_others": round(float(others.mean()), 4)}


@dataclass(frozen=True)
class Centres:
    """k subpopulation centres (on L2-normalised features) and what they were fitted on."""

    centres: np.ndarray
    """(k, D) float32."""
    card: dict[str, Any] | None
    """The model card of the features they were fitted on (None: features without a card)."""
    about: dict[str, Any] = field(default_factory=dict)
    """How they were fitted: k, dim, seed, sample, restarts, cells, the features' tag and run."""
    path: Path | None = None

    @property
    def k(self) -> int:
        return len(self.centres)

    def fits(self, card: dict[str, Any] | None, dim: int) -> str:
        """Why features of `card` and width `dim` cannot be counted in these subpopulations ("" when
        they can): the centres belong to one model's features, the same weights read the same way."""
        from training.models.card import ModelCard

        if dim != self.centres.shape[1]:
            return f"the centres are {self.centres.shape[1]}-wide, the features {dim}-wide"
        if self.card is None or card is None:
            return "the centres or the features carry no model card, so nothing says they are the same model's"
        ours, theirs = ModelCard.from_dict(self.card, self.path), ModelCard.from_dict(card, "the features")
        differ = ours.differences(theirs)
        if differ:
            return (f"their model cards differ in {', '.join(differ)} (the centres: {ours.describe()}; the features: "
                    f"{theirs.describe()})")
        return ""

    def check(self, card: dict[str, Any] | None, dim: int, k: int, what: str) -> None:
        """A UserError of one line when `what` (features of `card`, `dim` wide, asked for k
        subpopulations) cannot be counted in these centres."""
        self.check_k(k)
        problem = self.fits(card, dim)
        if problem:
            raise UserError(f"eval.profile_subpopulation_centres={self.path} cannot count {what}: {problem}; profile "
                            "with the model the centres were fitted with, or clear eval.profile_subpopulation_centres "
                            "to fit them on this screen")

    def check_k(self, k: int) -> None:
        """A UserError of one line unless these are the k subpopulations eval.profile_subpopulations asks for."""
        if k != self.k:
            raise UserError(f"eval.profile_subpopulation_centres={self.path} holds {self.k} subpopulations, "
                            f"eval.profile_subpopulations asks for {k}: set it to {self.k}, or clear "
                            f"eval.profile_subpopulation_centres to fit {k} on this screen")


def write_centres(path: Path, centres: np.ndarray, names: list[str], counts: np.ndarray,
                  card: dict[str, Any] | None, about: dict[str, Any]) -> None:
    """A centres file: a row per subpopulation (its name, its cells, its centre in the features'
    columns), the model card and `about` in the schema metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from training.models.card import PARQUET_KEY
    from training.writes.atomic import atomic_path

    k = len(centres)
    columns = {NAME_COLUMN: pa.array([subpopulation_name(i) for i in range(k)]),
               CELLS_COLUMN: pa.array(np.asarray(counts, np.int64))}
    columns.update({name: pa.array(np.ascontiguousarray(centres[:, i], np.float32)) for i, name in enumerate(names)})
    metadata = {CENTRES_KEY: json.dumps({**about, "k": k, "dim": int(centres.shape[1])}).encode()}
    if card:
        metadata[PARQUET_KEY] = json.dumps(card).encode()
    with atomic_path(path) as tmp:
        pq.write_table(pa.table(columns).replace_schema_metadata(metadata), tmp)


def read_centres(path: Path | str) -> Centres:
    """The centres `write_centres` wrote; a UserError of one line for a missing file or another file."""
    import pyarrow.parquet as pq

    from training.models.card import PARQUET_KEY

    path = Path(path)
    where = f"eval.profile_subpopulation_centres={path}"
    if not path.is_file():
        raise UserError(f"{where}: no such file; name a run's {CENTRES_FILE} (`export` writes it where "
                        "eval.profile_subpopulations is set), or clear the setting")
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several kinds for a file that is not Parquet
        raise UserError(f"{where} is not a Parquet file ({type(exc).__name__}): name a run's "
                        f"{CENTRES_FILE}") from None
    metadata = table.schema.metadata or {}
    if CENTRES_KEY not in metadata:
        raise UserError(f"{where} holds no subpopulation centres (no {CENTRES_KEY.decode()} record): name a run's "
                        f"{CENTRES_FILE}, which `export` writes")
    about = json.loads(metadata[CENTRES_KEY])
    names = [n for n in table.column_names if n not in (NAME_COLUMN, CELLS_COLUMN)]
    centres = np.stack([table.column(n).to_numpy() for n in names], axis=1).astype(np.float32)
    card = json.loads(metadata[PARQUET_KEY]) if PARQUET_KEY in metadata else None
    return Centres(centres, card, about, path)


def subpopulation_name(index: int) -> str:
    """A subpopulation's column in wells_subpopulations.parquet and its row in subpopulations.parquet."""
    return f"{SUBPOPULATION_PREFIX}{index:02d}"


def beside_shares(profiles: np.ndarray, shares: np.ndarray, controls: np.ndarray | None,
                  weight: float) -> np.ndarray:
    """(wells, D + k) float32: the normalised `profiles` beside the `shares` less the control wells'
    mean shares (every well's mean without controls), scaled so that on average over the wells the
    shares hold `weight` of the squared norm and the profiles 1 - weight."""
    if not 0 < weight < 1:
        raise ValueError(f"the shares' weight must be in (0, 1), got {weight}")
    profiles = np.asarray(profiles, np.float64)
    shares = np.asarray(shares, np.float64)
    reference = shares[controls] if controls is not None and np.any(controls) else shares
    shares = shares - reference.mean(axis=0)

    def scaled(block: np.ndarray, share: float) -> np.ndarray:
        power = float(np.mean(np.einsum("ij,ij->i", block, block)))
        return block * np.sqrt(share / power) if power > 0 else block

    return np.concatenate([scaled(profiles, 1 - weight), scaled(shares, weight)], axis=1).astype(np.float32)
