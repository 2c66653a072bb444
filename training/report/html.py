"""Build report.html from the files of a run: config, tables, embedded figures, artefact list.

Figures are embedded as base64 PNG so the file stands alone, and each links to its PNG/PDF beside
the report (paths are relative to the run directory, where report.html lies). A section whose
input is missing says which step fills it.
"""

from __future__ import annotations

import base64
import html
import logging
import os
from pathlib import Path
from typing import Any

from training.eval.compare import (
    MODEL_NAMES,
    PER_COMBINATION,
    SCREEN_NOTE,
    adaptive_models,
    comparison_rows,
    knn_note,
    side_by_side_rows,
)
from training.eval.tables import (
    finetune_rows,
    has_screen_measures,
    knn_rows,
    knn_setup,
    linear_rows,
    screen_rows,
    screen_setup,
)
from training.plots.figures import PlotEntry, read_manifest
from training.results import knn_headline
from training.rundir import RunLayout
from training.rundir.artifacts import read_metrics, read_optional_json, read_timings

log = logging.getLogger(__name__)

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
h1{margin-bottom:.2em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.6em 0;font-size:.92em}
td,th{border:1px solid #ccc;padding:.3em .6em;text-align:right}th{background:#f3f3f3}
td:first-child,th:first-child{text-align:left}
figure{display:inline-block;margin:.6em;vertical-align:top;max-width:100%}
figure img{max-width:100%;border:1px solid #eee}figcaption{font-size:.85em;color:#555;max-width:640px}
pre{background:#f7f7f7;padding:.8em;overflow:auto;font-size:.85em}.missing{color:#a33}
.headline{font-size:1.1em;background:#eef5ff;padding:.6em 1em;border-radius:6px}
"""

ARTEFACTS = (
    ("config", "resolved configuration"),
    ("split", "train / hold-out split"),
    ("mean_std", "per-channel mean and std"),
    ("checkpoints", "checkpoints (latest and numbered)"),
    ("metrics", "training metrics, one JSON object per line"),
    ("tensorboard", "TensorBoard event files"),
    ("features_root", "CLS features per tag"),
    ("labels", "held-out labels and paths"),
    ("knn_json", "kNN accuracies, per-class accuracy, confusion matrices"),
    ("knn_md", "kNN table"),
    ("linear_json", "linear-probe accuracy per epoch"),
    ("profiles_h5ad", "per-cell AnnData for scanpy: obsm['X_scdino'], metadata and split in obs (`export`)"),
    ("profiles_cells", "per-cell profiles, Parquet, Metadata_ columns then features (`export`)"),
    ("profiles_wells", "per-well profiles (median or mean of the cells), Parquet, for pycytominer (`export`)"),
    ("profiles_manifest", "what `export` wrote and where the features came from"),
    ("finetune_json", "fine-tuning accuracy per epoch (optional `linear --finetune`)"),
    ("finetune_weights", "fine-tuned backbone and head"),
    ("plots", "figures (PNG, PDF) and their manifest"),
    ("timings", "wall time of each step"),
)
"""(RunLayout path name, what it holds) of every artefact the report links to."""


def esc(value: Any) -> str:
    """HTML-escaped text of any value."""
    return html.escape(str(value))


def html_table(header: list[str], rows: list[list[str]]) -> str:
    """A plain HTML table with a header row."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def missing(what: str, step: str) -> str:
    """The note shown in place of a section whose input is missing."""
    return f'<p class="missing">No {esc(what)} yet: run <code>python -m training {esc(step)}</code>.</p>'


def figure(layout: RunLayout, entry: PlotEntry) -> str:
    """An embedded PNG linking to its files; a missing PNG is reported, not silently dropped."""
    png = layout.plots / entry.png
    if not png.is_file():
        return f'<p class="missing">figure {esc(entry.png)} listed in the manifest is missing</p>'
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    links = [f'<a href="plots/{esc(entry.png)}">PNG</a>']
    if entry.pdf:
        links.append(f'<a href="plots/{esc(entry.pdf)}">PDF</a>')
    return (f'<figure><a href="plots/{esc(entry.png)}"><img alt="{esc(entry.title)}" '
            f'src="data:image/png;base64,{data}"></a><figcaption><b>{esc(entry.title)}</b>. '
            f'{esc(entry.caption)} ({" | ".join(links)})</figcaption></figure>')


def figures(layout: RunLayout, entries: list[PlotEntry], section: str) -> str:
    """Every figure of one manifest section, embedded."""
    return "".join(figure(layout, e) for e in entries if e.section == section)


def headline(knn: dict[str, Any] | None) -> str:
    """One sentence: trained top-1 at its best k against both baselines; on a screen also the
    not-same-batch top-1 and the mAP of each."""
    if not knn:
        return ""
    models = knn_headline(knn).values()
    parts = [f"{m['label']} {100 * m['top1']:.1f}% (k={m['best_k']})" for m in models]
    sentences = [f"kNN top-1 accuracy: {', '.join(parts)}."] if parts else []
    other = [f"{m['label']} {100 * m['not_same_batch']['top1']:.1f}%" for m in models if "not_same_batch" in m]
    if other:
        sentences.append(f"Not same batch: {', '.join(other)}.")
    scored = [f"{m['label']} {m['map']['mean_map']:.3f} ({m['map']['n_significant']}/{m['map']['n_treatments']} "
              "treatments q < 0.05)" for m in models if m.get("map") and m["map"]["mean_map"] is not None]
    if scored:
        sentences.append(f"mAP: {', '.join(scored)}.")
    return f'<p class="headline">{esc(" ".join(sentences))}</p>' if sentences else ""


def relative_link(layout: RunLayout, path: Path) -> str:
    """PATH relative to the report; a combination's run links up to its parent's data files."""
    return Path(os.path.relpath(path, layout.root)).as_posix()


def artefact_rows(layout: RunLayout) -> list[str]:
    """One table row per run artefact: a link when present, the status otherwise."""
    rows = []
    for name, description in ARTEFACTS:
        path = getattr(layout, name)
        relative = relative_link(layout, path)
        if path.exists():
            link = f'<a href="{esc(relative)}">{esc(relative)}</a>'
            rows.append(f"<tr><td>{link}</td><td>{esc(description)}</td><td>present</td></tr>")
        else:
            rows.append(f"<tr><td>{esc(relative)}</td><td>{esc(description)}</td><td>absent</td></tr>")
    return rows


def artefacts_section(layout: RunLayout) -> str:
    """Where every file of the run lies, relative to the report."""
    rows = "".join(artefact_rows(layout))
    return (f"<h2>Where everything lies</h2><p>Run directory: <code>{esc(layout.root.resolve())}</code>; "
            f"links are relative to this report.</p><table><tr><th>path</th><th>what</th><th>status</th></tr>"
            f"{rows}</table>")


def results_sections(layout: RunLayout, entries: list[PlotEntry], knn: Any, linear: Any) -> list[str]:
    """Training curves, kNN and linear tables with their figures, UMAPs and attention maps."""
    parts = ["<h2>Training</h2>", *collapse_lines(layout),
             figures(layout, entries, "curves") or missing("training curves", "plots")]
    parts.append("<h2>Global kNN (top-1 / top-2 %)</h2>")
    if knn:
        parts.append(f"<p>{esc(knn_setup(knn))}</p>" + html_table(*knn_rows(knn)))
        parts += screen_lines(knn)
    else:
        parts.append(missing("kNN results", "knn"))
    parts += [figures(layout, entries, "knn"), figures(layout, entries, "confusion")]
    parts.append("<h2>Linear probe (validation top-1 %)</h2>")
    parts.append(html_table(*linear_rows(linear)) if linear else missing("linear-probe results", "linear"))
    parts += finetune_section(layout)
    parts += profiles_section(layout)
    parts += ["<h2>UMAP</h2>", figures(layout, entries, "umap") or missing("UMAPs", "plots")]
    parts += ["<h2>Attention maps</h2>", figures(layout, entries, "attention") or missing("attention maps", "plots")]
    return parts


def screen_lines(knn: dict[str, Any]) -> list[str]:
    """The not-same-batch kNN table and plain kNN against it and mAP, where the run measured them."""
    if not has_screen_measures(knn):
        return []
    lines = ["<h3>Screen measures</h3>", f"<p>{esc(screen_setup(knn))}</p>", html_table(*screen_rows(knn))]
    if "not_same_batch" in knn:
        lines += ["<p>Not same batch, every k (top-1 / top-2 %):</p>", html_table(*knn_rows(knn, "not_same_batch"))]
    return lines


def profiles_section(layout: RunLayout) -> list[str]:
    """What `export` wrote and how to open it; nothing before `export` has run (the artefact table
    lists its files as absent)."""
    record = read_optional_json(layout.profiles_manifest, "export")
    if not record:
        return []
    wells = record.get("wells")
    about = (f"{wells['n_wells']} wells by {wells['plate_column']} and {wells['well_column']}" if wells
             else "no per-well profiles: the dataset has no plate and well columns")
    links = ", ".join(f'<a href="{esc(name)}">{esc(name)}</a>' for name in record["files"])
    return ["<h2>Profiles</h2>",
            f"<p>{record['n_cells']} cells ({record['n_held_out']} held out) x {record['dim']} features of "
            f"<code>{esc(record['provenance'].get('tag'))}</code>; {esc(about)}. Files: {links}.</p>",
            "<p>scanpy: <code>adata = anndata.read_h5ad(...)</code>, <code>sc.pp.neighbors(adata, "
            "use_rep='X_scdino')</code>; pycytominer: <code>pd.read_parquet(...)</code>, features inferred from "
            "the Cells_ prefix, metadata from Metadata_.</p>"]


INGEST_BAD_SHOWN = 10
"""Bad fields of view listed in the report; ingest_report.json and bad_images.json list them all."""


def packed_by_ingest(layout: RunLayout) -> bool:
    """Whether the run's packed dataset records `ingest` as the step that made it."""
    from training.data.store.format import is_packed, writer_step

    return is_packed(layout.packed) and writer_step(layout.packed) == "ingest"


def ingest_section(layout: RunLayout) -> list[str]:
    """Where the cells came from when `ingest` cut them out of fields of view: every count of
    ingest_report.json, each reason an object was skipped, the first bad fields; nothing for a
    dataset of single-cell images."""
    report = read_optional_json(layout.ingest_report, "ingest")
    if report is None and packed_by_ingest(layout):
        from training.data.store.format import INDEX_FILE

        log.warning("%s is missing (%s/%s records that `ingest` made the dataset): the report leaves out where the "
                    "cells came from; rerun `python -m training ingest` to write it again", layout.ingest_report,
                    layout.packed.name, INDEX_FILE)
    if not report:
        return []
    counts = [("fields of view read", report.get("fields", 0)), ("bad fields of view", report.get("bad_fields", 0)),
              ("fields without objects", report.get("fields_without_objects", 0)),
              ("objects found", report.get("objects", 0)), ("cells cut", report.get("cut", 0)),
              *((f"skipped: {reason}", n) for reason, n in report.get("skipped", {}).items())]
    if report.get("centres_without_field"):
        counts.append(("centres matching no field", report["centres_without_field"]))
    parts = ["<h2>Cells cut from fields of view</h2>",
             f"<p><code>ingest</code> read <code>{esc(report.get('table'))}</code> in {report.get('parts', 1)} "
             "part(s); nothing is dropped without a count below.</p>",
             html_table(["", "count"], [[name, f"{int(n):,}"] for name, n in counts])]
    bad = report.get("bad", [])
    if bad:
        rows = [[b.get("field"), b.get("column"), b.get("reason")] for b in bad[:INGEST_BAD_SHOWN]]
        more = (f" (the first {INGEST_BAD_SHOWN} of {len(bad)}: all in {layout.ingest_report.name})"
                if len(bad) > INGEST_BAD_SHOWN else "")
        parts += [f"<p>Bad fields of view, skipped{more}:</p>", html_table(["field", "column", "reason"], rows)]
    return parts


def collapse_lines(layout: RunLayout) -> list[str]:
    """A warning when the collapse detector flagged the pretraining (metrics.jsonl's "collapse");
    nothing otherwise."""
    if not layout.metrics.is_file():
        return []
    flagged = [r for r in read_metrics(layout) if r.get("kind") == "step" and r.get("collapse")]
    if not flagged:
        return []
    first, last = flagged[0], flagged[-1]
    return [f'<p class="missing">DINO collapse ({esc(first["collapse"])}) flagged in the logged steps from '
            f"{first['step']} to {last['step']}: the teacher's target carried no information about the image "
            "there, so the features below are not to be trusted. The training log's WARNING names the usual "
            "remedies; docs/training.md, \"Collapse\", explains them.</p>"]


def finetune_section(layout: RunLayout) -> list[str]:
    """The fine-tuned backbone's table; nothing when `linear --finetune` (optional) has not run."""
    finetune = read_optional_json(layout.finetune_json, "linear --finetune")
    if not finetune:
        return []
    return ["<h2>Fine-tuned backbone (validation top-1 %)</h2>",
            f"<p>Backbone and linear head trained on the {finetune['n_train']} reference images, validated "
            f"on the {finetune['n_val']} query images of the kNN split, {finetune['world_size']} rank(s).</p>",
            html_table(*finetune_rows(finetune))]


def comparison_section(layout: RunLayout, entries: list[PlotEntry]) -> list[str]:
    """Every channel combination's run against its baselines; nothing before `compare` has run."""
    comparison = read_optional_json(layout.comparison_json, "compare")
    if not comparison:
        return []
    links = ", ".join(f'<a href="{esc(relative_link(layout, layout.combination(c).report))}">{esc(c)}</a>'
                      for c in comparison["models"][PER_COMBINATION]["combinations"])
    note = knn_note(comparison)
    knn_line = [f"<p>{esc(note)}</p>"] if note else []
    if any(key in scores for entry in comparison["models"][PER_COMBINATION]["combinations"].values()
           for scores in entry["knn"].values() for key in ("not_same_batch", "map")):
        knn_line.append(f"<p>{esc(SCREEN_NOTE)}</p>")
    return ["<h2>Channel combinations (kNN top-1 / top-2 %, linear probe top-1 %)</h2>", *knn_line,
            *channel_adaptive_lines(comparison),
            f"<p>One pretraining per combination, each with its own report: {links}.</p>",
            html_table(*comparison_rows(comparison)), figures(layout, entries, "combinations")]


def channel_adaptive_lines(comparison: dict[str, Any]) -> list[str]:
    """With data.compare_channel_adaptive: the models side by side, then each channel-adaptive
    model against its baselines; nothing otherwise."""
    adaptive = adaptive_models(comparison)
    if not adaptive:
        return []
    names = " and ".join(f"one {MODEL_NAMES[m]}" for m in adaptive)
    lines = [f"<p>One model per combination against {esc(names)}, each trained once on channels "
             f"{esc(comparison['models'][adaptive[0]]['channels'])} and evaluated on each combination without "
             "retraining (trained models; the last row is each way's total training compute, measured and in "
             "analytic FLOPs):</p>", html_table(*side_by_side_rows(comparison))]
    for model in adaptive:
        lines += [f"<p>The {esc(MODEL_NAMES[model])} against its baselines on each combination:</p>",
                  html_table(*comparison_rows(comparison, model))]
    return lines


def _money(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


def bill_section(layout: RunLayout) -> list[str]:
    """What the run cost by Slurm's accounting, job by job, beside the planner's prediction."""
    bill = (read_optional_json(layout.results) or {}).get("bill")
    if not bill:
        return ["<h2>Cost</h2>", '<p>No bill yet: run <code>python -m training summary --jobs '
                "&lt;the submitter's STEP JOBID lines&gt;</code> after the pipeline.</p>"]
    unit = {"gpu_h": "GPU-hours", "core_h": "core-hours"}.get(bill["unit"], str(bill["unit"]))
    rows = [[j["step"], j["job"], j["preset"] or j["partition"], j["nodes"], j["cpus"], j["seconds"],
             f"{j['unit_h']:.4f}", _money(j["cost_usd"])] for j in bill["jobs"]]
    rows += [[name, "", "", "", "", bill[name]["seconds"], f"{bill[name]['unit_h']:.4f}",
              _money(bill[name]["cost_usd"])] for name in ("pretrain", "total")]
    parts = ["<h2>Cost</h2>", f"<p>{esc(unit)} and on-demand cost from Slurm's accounting ({esc(bill['source'])}); "
             f"{esc(bill['note'])}.</p>",
             html_table(["step", "job", "preset", "nodes", "CPUs", "seconds", unit, "cost"], rows)]
    predicted = bill.get("predicted")
    if predicted and "pretrain_s" in predicted:
        actual = bill["pretrain"]
        parts += [f"<p>Pretraining against the plan saved by <code>plan --save</code> ({esc(predicted['preset'])} "
                  f"on {predicted['nodes']} node(s), bottleneck {esc(predicted['bottleneck'])}):</p>",
                  html_table(["", "predicted", "actual"], [
                      ["wall, s", f"{predicted['pretrain_s']:.1f}", actual["seconds"]],
                      [f"{unit} ({esc(predicted['unit'])} predicted)", f"{predicted['unit_h']:.4f}",
                       f"{actual['unit_h']:.4f}"],
                      ["cost", _money(predicted["cost_usd"]), _money(actual["cost_usd"])]])]
    else:
        parts.append("<p>No prediction beside it: run <code>python -m training plan --save</code> before the run.</p>")
    return parts


def report_title(config_name: str) -> str:
    return f"scDINO run {config_name}"


def rewrite_report(layout: RunLayout) -> None:
    """report.html again, from the run's files as they are now (the summary adds the bill after it)."""
    import yaml

    from training.writes.atomic import write_text_atomic

    name = (yaml.safe_load(layout.config.read_text()) or {}).get("run", {}).get("name", "") if layout.config.is_file() \
        else layout.root.name
    write_text_atomic(layout.report, build_report(layout, report_title(name)))


def build_report(layout: RunLayout, title: str) -> str:
    """The whole HTML document as a string."""
    entries = read_manifest(layout)
    knn = read_optional_json(layout.knn_json, "knn")
    linear = read_optional_json(layout.linear_json, "linear")
    timings = read_timings(layout)
    config_text = layout.config.read_text() if layout.config.is_file() else f"({layout.config.name} missing)"
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{esc(title)}</title>"
             f"<style>{CSS}</style></head><body><h1>{esc(title)}</h1>", headline(knn)]
    parts += ingest_section(layout)
    comparison = comparison_section(layout, entries)
    parts += comparison
    if knn or not comparison:  # the parent of combination runs trains nothing itself
        parts += results_sections(layout, entries, knn, linear)
    parts.append("<h2>Step timings</h2>" + html_table(["step", "seconds"], [[k, f"{v:.1f}"] for k, v in timings.items()]))
    parts += bill_section(layout)
    parts.append(f"<h2>Configuration</h2><pre>{esc(config_text)}</pre>")
    parts += [artefacts_section(layout), "</body></html>"]
    return "\n".join(parts)
