"""Reports of a sweep: summary.json, report.md and a PNG chart of the pass rates, from results.jsonl.

The headline counts every selected class in every group (a class with no record is ``not run``) and takes its
figures from the records of one code revision (:func:`headline_revision`); records of other revisions are
history, counted apart. Each group is engine × backend × shapes × cache kind (:func:`cache_of`); the headline
rate is the ``default`` kind's (the model's own ``use_cache``), the ``off`` kind (``use_cache=False``) is shown
beside it."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

from .job import BACKENDS, ENGINES
from .signal_check import RULE

OUTCOMES = ("pass", "skip", "fail", "timeout", "crash", "oom")


def latest(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last record of each job key (a rerun replaces the earlier record), its error kind given
    by the current classifier (:func:`~.job.classify`), so improving the classification needs no rerun."""
    from .job import classify

    by_key: dict[str, dict[str, Any]] = {}
    for record in records:
        by_key[record["key"]] = record
    out = []
    for record in by_key.values():
        if record.get("outcome") not in ("pass", "skip") and record.get("message"):
            record = {**record, "kind": classify(record["message"], record["outcome"])}
        out.append(record)
    return out


def headline_revision(records: list[dict[str, Any]], requested: str | None = None) -> str | None:
    """The code revision whose records make the headline: ``requested`` when given, else the revision of the
    newest record (by its ``finished`` time, then by its place in the file); None when no record names one."""
    if requested:
        return requested
    newest: tuple[str, int] | None = None
    revision = None
    for index, record in enumerate(records):
        if not record.get("revision"):
            continue
        stamp = (record.get("finished") or "", index)
        if newest is None or stamp >= newest:
            newest, revision = stamp, record["revision"]
    return revision


def shapes_of(record: dict[str, Any]) -> str:
    """``static``, ``dynamic`` or ``generation`` (token-id parity of a generation-mode job)."""
    return "generation" if record.get("mode") == "generation" else ("dynamic" if record["dynamic"] else "static")


def cache_of(record: dict[str, Any]) -> str:
    """The cache kind of a record: ``default`` or ``off`` (a forward record without ``cache``, written before cache
    kinds existed, is ``off``: its model was built with ``use_cache=False``); a generation record is ``default``."""
    from .runner import cache_label

    return cache_label(record)


#: the cache kind whose rates are the headline
HEADLINE_CACHE = "default"


def backend_of(record: dict[str, Any]) -> str:
    """The backend, ``executorch (cpp)`` for ExecuTorch jobs run on the C++ runner."""
    return f"{record['backend']} (cpp)" if record.get("runtime") == "cpp" else record["backend"]


def _group(record: dict[str, Any]) -> str:
    return f"{record['engine']}|{backend_of(record)}|{shapes_of(record)}|{cache_of(record)}"


def _failure_stage(record: dict[str, Any]) -> str:
    if record["outcome"] in ("timeout", "crash", "oom"):
        return record["outcome"]
    stage = record.get("stage") or "unknown"
    return stage


def _is_degenerate(record: dict[str, Any]) -> bool:
    return record.get("outcome") == "fail" and (record.get("kind") == "degenerate model" or record.get("stage") == "signal" and "degenerate model" in (record.get("message") or ""))


def _selection(records: list[dict[str, Any]], selection: dict[str, Any] | None) -> dict[str, Any]:
    """``{"forward": classes, "generation": classes, "cache": {"default": classes, "off": classes}}`` selected:
    ``cache`` gives the forward classes planned in each cache kind (``off``: those whose config has ``use_cache``);
    a selection without it counts every forward class in both kinds. Without a selection, the classes recorded
    in each mode and kind under any revision."""
    if selection is not None:
        forward = sorted(selection.get("forward", []))
        kinds = selection.get("cache") or {}
        return {
            "forward": forward,
            "generation": sorted(selection.get("generation", [])),
            "cache": {k: sorted(kinds[k]) if k in kinds else forward for k in ("default", "off")},
        }
    forward_records = [r for r in records if r.get("mode") != "generation"]
    return {
        "forward": sorted({r["model_class"] for r in forward_records}),
        "generation": sorted({r["model_class"] for r in records if r.get("mode") == "generation"}),
        "cache": {k: sorted({r["model_class"] for r in forward_records if cache_of(r) == k}) for k in ("default", "off")},
    }


def _pool(selected: dict[str, Any], shapes: str, cache: str) -> list[str]:
    """The selected classes of a group: generation's, or the forward classes planned in that cache kind."""
    return selected["generation"] if shapes == "generation" else selected["cache"][cache]


def headline_records(
    records: list[dict[str, Any]], revision: str | None, selection: dict[str, list[str]]
) -> list[dict[str, Any]]:
    """The latest record of each job of the headline: recorded under ``revision`` (every record when it is None)
    and of a selected class."""
    kept = [
        r for r in records
        if (revision is None or r.get("revision") == revision)
        and r["model_class"] in _pool(selection, shapes_of(r), cache_of(r))
    ]
    return latest(kept)


def summarize(
    records: list[dict[str, Any]], meta: dict[str, Any], selection: dict[str, list[str]] | None = None,
    revision: str | None = None,
) -> dict[str, Any]:
    """Per engine × backend × shapes × cache kind, over every selected class: pass, skip, fail (degenerate counted apart),
    not run (no record at the headline revision), failures by stage and by kind, pass rate = pass / selected.

    ``selection``: the selected classes per mode (:func:`_selection`); ``revision``: the headline revision
    (:func:`headline_revision` of ``records`` when None). Groups are those any record names (any revision)."""
    selected = _selection(records, selection)
    requested = bool(revision)
    forward, generation = set(selected["forward"]), set(selected["generation"])

    def of_selection(record: dict[str, Any]) -> bool:  # a record of a selected class in its mode
        return record["model_class"] in (generation if shapes_of(record) == "generation" else forward)

    # the newest forward record of a selected class: records of other classes (the non-base sample) do not move the
    # headline, nor do generation records (the generative sample runs at a revision of its own) while forward ones exist
    chosen = [r for r in records if of_selection(r)]
    revision = headline_revision([r for r in chosen if shapes_of(r) != "generation"] or chosen, revision)
    rows = headline_records(records, revision, selected)
    groups: dict[str, dict[str, Any]] = {}
    order = {"static": 0, "dynamic": 1, "generation": 2}
    every = sorted(
        {(r["engine"], backend_of(r), shapes_of(r), r["backend"], bool(r["dynamic"]), cache_of(r)) for r in records},
        key=lambda g: (ENGINES.index(g[0]) if g[0] in ENGINES else 9, g[3], order[g[2]], g[1], g[5] != HEADLINE_CACHE),
    )
    for engine, backend, shapes, _, dynamic, cache in every:
        groups[f"{engine}|{backend}|{shapes}|{cache}"] = {
            "engine": engine,
            "backend": backend,
            "dynamic": dynamic,
            "shapes": shapes,
            "cache": cache,
            "headline": cache == HEADLINE_CACHE,
            "selected": len(_pool(selected, shapes, cache)),
            "total": 0,  # jobs recorded at the headline revision
            "pass": 0,
            "skip": 0,
            "fail": 0,
            "degenerate": 0,
            "not_run": 0,
            "failures_by_stage": collections.Counter(),
            "failures_by_kind": collections.Counter(),
            "passes_on_one_input_set": [],
            "not_run_classes": [],
        }
    recorded: dict[str, set[str]] = collections.defaultdict(set)
    for record in sorted(rows, key=lambda r: r["model_class"]):
        g = groups[_group(record)]
        recorded[_group(record)].add(record["model_class"])
        g["total"] += 1
        outcome = record["outcome"]
        if outcome == "pass":
            g["pass"] += 1
            if record["dynamic"] and record.get("mode") != "generation" and record.get("input_sets") == 1:
                g["passes_on_one_input_set"].append(record["model_class"])
        elif outcome == "skip":
            g["skip"] += 1
        else:
            g["fail"] += 1
            g["degenerate"] += _is_degenerate(record)
            g["failures_by_stage"][_failure_stage(record)] += 1
            g["failures_by_kind"][record.get("kind") or "other"] += 1
    for name, g in groups.items():
        pool = _pool(selected, g["shapes"], g["cache"])
        g["not_run_classes"] = [c for c in pool if c not in recorded[name]]
        g["not_run"] = len(g["not_run_classes"])
        g["pass_rate"] = round(g["pass"] / g["selected"], 4) if g["selected"] else 0.0
        g["failures_by_stage"] = dict(g["failures_by_stage"].most_common())
        g["failures_by_kind"] = dict(g["failures_by_kind"].most_common())
    at_revision = [r for r in records if revision is None or r.get("revision") == revision]
    headline_all = [r for r in at_revision if of_selection(r)]
    # history: the selected classes' records of other revisions; records of other classes (the sample's) are apart
    history = [r for r in records if of_selection(r) and not (revision is None or r.get("revision") == revision)]
    return {
        **meta,
        "headline_revision": revision,
        "headline_revision_requested": requested,
        "headline_cache": HEADLINE_CACHE,
        "cache_classes_selected": {k: len(v) for k, v in selected["cache"].items()},
        "classes_selected": len(selected["forward"]),
        "generation_classes_selected": len(selected["generation"]),
        "classes_run": len({r["model_class"] for r in rows if r.get("mode") != "generation"}),
        "generation_classes_run": len({r["model_class"] for r in rows if r.get("mode") == "generation"}),
        "jobs_recorded": len(rows),
        "records_total": len(records),
        "records_headline": len(headline_all),
        "records_outside_selection": sum(1 for r in records if not of_selection(r)),
        "records_history": len(history),
        "revisions_history": len({r.get("revision") for r in history}),
        "history_groups": _history_groups(records, selected),
        "groups": groups,
    }


def _history_groups(records: list[dict[str, Any]], selected: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """Per group, the latest record of each selected class's job under any revision: what the records say when
    revisions are mixed (history, not the headline)."""
    rows = headline_records(records, None, selected)
    out: dict[str, dict[str, Any]] = {}
    for record in rows:
        g = out.setdefault(_group(record), {"recorded": 0, "pass": 0, "revisions": set()})
        g["recorded"] += 1
        g["pass"] += record["outcome"] == "pass"
        g["revisions"].add(record.get("revision"))
    return {k: {**v, "revisions": len(v["revisions"])} for k, v in out.items()}


def _table(summary: dict[str, Any]) -> list[str]:
    lines = [
        "| engine | backend | shapes | cache | pass / selected | pass rate | skip | fail | of which degenerate | not run | failures by stage |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for g in summary["groups"].values():
        stages = ", ".join(f"{k} {v}" for k, v in list(g["failures_by_stage"].items())[:5])
        lines.append(
            f"| {g['engine']} | {g['backend']} | {g.get('shapes', 'dynamic' if g['dynamic'] else 'static')} | {g.get('cache', 'off')} | "
            f"{g['pass']} / {g.get('selected', g['total'])} | {100 * g['pass_rate']:.1f}% | {g['skip']} | {g['fail']} | "
            f"{g.get('degenerate', 0)} | {g.get('not_run', 0)} | {stages} |"
        )
    return lines


def summarize_scopes(
    records: list[dict[str, Any]], summary: dict[str, Any], universe: list[str] | None
) -> list[dict[str, Any]]:
    """The headline table's rows, cache ``default``, at the headline revision, per engine × backend: ``base``
    (the selected forward classes, static and dynamic: :func:`summarize`'s groups), ``all`` (every model class of
    ``universe``, static: a class without a record at the headline revision is not run) and ``generation``.
    Each cell: pass, selected, not run (a cell with no record is all not run)."""
    revision = summary.get("headline_revision")
    cells: dict[tuple[str, str], dict[str, Any]] = {}
    for g in summary["groups"].values():
        if g.get("cache") != HEADLINE_CACHE or g["backend"].endswith("(cpp)"):
            continue
        scope = "generation" if g["shapes"] == "generation" else f"base {g['shapes']}"
        cells[(scope, f"{g['engine']} {g['backend']}")] = {"pass": g["pass"], "selected": g["selected"], "not_run": g["not_run"]}
    if universe:
        members = set(universe)
        rows = latest([
            r for r in records
            if (revision is None or r.get("revision") == revision) and r["model_class"] in members
            and shapes_of(r) == "static" and cache_of(r) == HEADLINE_CACHE and r.get("runtime") != "cpp"
        ])
        by: dict[str, dict[str, str]] = collections.defaultdict(dict)
        for r in rows:
            by[f"{r['engine']} {r['backend']}"][r["model_class"]] = r["outcome"]
        for engine in ENGINES:
            for backend in BACKENDS:
                outcomes = by.get(f"{engine} {backend}", {})
                cells[("all static", f"{engine} {backend}")] = {
                    "pass": sum(o == "pass" for o in outcomes.values()), "selected": len(members),
                    "not_run": len(members) - len(outcomes),
                }
    order = {"base static": 0, "base dynamic": 1, "all static": 2, "generation": 3}
    out = []
    for scope in sorted({k[0] for k in cells}, key=lambda x: order.get(x, 9)):
        row = {"scope": scope, "cells": {}}
        for engine in ENGINES:
            for backend in BACKENDS:
                if (scope, f"{engine} {backend}") in cells:
                    row["cells"][f"{engine} {backend}"] = cells[(scope, f"{engine} {backend}")]
        out.append(row)
    return out


#: cells of the headline table no run plans (``make sweep-full``): every class runs on dynamo and ONNX with our
#: engine only; generation runs with our engine, on ExecuTorch for the generative sample only (its own section)
_NOT_PLANNED = {
    ("all static", "ours executorch"): "not planned",
    **{("all static", f"upstream {b}"): "not planned" for b in BACKENDS},
    **{("generation", f"upstream {b}"): "not planned (our engine only)" for b in BACKENDS},
    ("generation", "ours executorch"): "the generative sample only (below)",
}


def _scope_label(scope: str, summary: dict[str, Any]) -> str:
    kind, _, shapes = scope.partition(" ")
    if scope == "generation":
        return f"generation (token ids), {summary.get('generation_classes_selected', '?')} generative classes"
    if kind == "all":
        return f"all {summary.get('classes_total', '?')} classes, {shapes}"
    selected = (summary.get("cache_classes_selected") or {}).get(HEADLINE_CACHE, summary.get("classes_selected", "?"))
    return f"{selected} {summary.get('class_set', 'base')} classes, {shapes}"


def _scope_cell(c: dict[str, Any]) -> str:
    """``pass / selected (rate)`` when every selected class ran; else ``pass / selected, N not run`` and the rate over
    the classes run, so a partly run scope does not read as a pass rate."""
    if not c["selected"]:
        return "none selected"
    if not c["not_run"]:
        return f"{c['pass']} / {c['selected']} ({100 * c['pass'] / c['selected']:.1f}%)"
    run = c["selected"] - c["not_run"]
    rate = f"{100 * c['pass'] / run:.1f}% of the {run} run" if run else "none run"
    return f"{c['pass']} / {c['selected']}, {c['not_run']} not run ({rate})"


def _scope_table(summary: dict[str, Any]) -> list[str]:
    scopes = summary.get("scopes") or []
    if not scopes:
        return []
    columns = [f"{e} {b}" for e in ENGINES for b in BACKENDS]
    lines = [
        "| scope | " + " | ".join(columns) + " |",
        "|---|" + "---:|" * len(columns),
    ]
    for row in scopes:
        cells = []
        for column in columns:
            c = row["cells"].get(column)
            if (row["scope"], column) in _NOT_PLANNED:
                cells.append(_NOT_PLANNED[(row["scope"], column)])
                continue
            if c is None:  # no record at any revision: every selected class not run
                selected = summary.get("generation_classes_selected" if row["scope"] == "generation" else "classes_selected") or 0
                if row["scope"] != "generation":
                    selected = (summary.get("cache_classes_selected") or {}).get(HEADLINE_CACHE, selected)
                c = {"pass": 0, "selected": selected, "not_run": selected}
            cells.append(_scope_cell(c))
        lines.append(f"| {_scope_label(row['scope'], summary)} | " + " | ".join(cells) + " |")
    return lines


def _kinds_side_by_side(summary: dict[str, Any]) -> list[str]:
    """One row per engine × backend × shapes of forward jobs: the ``default`` kind's pass / selected (the headline)
    beside the ``off`` kind's."""
    rows: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
    for g in summary["groups"].values():
        if g.get("shapes") == "generation":
            continue
        rows.setdefault((g["engine"], g["backend"], g["shapes"]), {})[g.get("cache", "off")] = g

    def cell(g: dict[str, Any] | None) -> str:
        return "no record" if g is None else f"{g['pass']} / {g['selected']} ({100 * g['pass_rate']:.1f}%)"

    lines = [
        "| engine | backend | shapes | cache default (headline) | cache off |",
        "|---|---|---|---:|---:|",
    ]
    for (engine, backend, shapes), kinds in rows.items():
        lines.append(f"| {engine} | {backend} | {shapes} | {cell(kinds.get('default'))} | {cell(kinds.get('off'))} |")
    return lines


def _history_table(summary: dict[str, Any]) -> list[str]:
    history = summary.get("history_groups") or {}
    if not summary.get("records_history"):
        return []
    lines = [
        "## History: other revisions",
        "",
        f"{summary['records_history']} records of {summary.get('revisions_history', '?')} other code revisions are kept "
        "as history only: they count in no figure above. The latest record of each selected class's job under any "
        "revision (mixed revisions, not comparable with the headline):",
        "",
        "| engine | backend | shapes | cache | recorded | pass | revisions |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    for name in [*summary["groups"], *(k for k in history if k not in summary["groups"])]:
        g = history.get(name)
        if g is None:
            continue
        engine, backend, shapes, cache = name.split("|")
        lines.append(f"| {engine} | {backend} | {shapes} | {cache} | {g['recorded']} | {g['pass']} | {g['revisions']} |")
    return [*lines, ""]


def _not_run_lines(summary: dict[str, Any]) -> list[str]:
    """A line per group naming (the first of) its selected classes with no record at the headline revision."""
    lines = []
    for g in summary["groups"].values():
        names = g.get("not_run_classes", [])
        label = f"{g['engine']} {g['backend']} {g['shapes']} cache {g.get('cache', 'off')}"
        if names and not g["total"]:
            lines.append(f"- {label}: no record at the headline revision: all {len(names)} selected classes not run.")
        elif names:
            shown = ", ".join(names[:12]) + (f", ... ({len(names) - 12} more, all in summary.json)" if len(names) > 12 else "")
            lines.append(f"- {label}: {len(names)} not run: {shown}.")
    return ([*lines, ""] if lines else [])


def compare_engines(records: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Jobs (class, backend, shapes, cache kind) that pass with ours and fail upstream, and the reverse
    (``records``: the headline's, :func:`headline_records`)."""
    by = {(r["engine"], backend_of(r), shapes_of(r), cache_of(r), r["model_class"]): r["outcome"] for r in latest(records)}
    ours_only, upstream_only = [], []
    for (engine, backend, shapes, cache, cls), outcome in sorted(by.items()):
        if engine != "ours":
            continue
        other = by.get(("upstream", backend, shapes, cache, cls))
        if other is None:
            continue
        label = f"{cls} ({backend}, {shapes}, cache {cache})"
        if outcome == "pass" and other != "pass":
            ours_only.append(label)
        elif other == "pass" and outcome not in ("pass", "skip"):
            upstream_only.append(label)
    return {"ours_pass_upstream_fails": ours_only, "upstream_pass_ours_fails": upstream_only}


def signal_changes(records: list[dict[str, Any]], revision: str | None, selection: dict[str, Any] | None = None) -> dict[str, dict[str, list[str]]]:
    """What the signal rule (:mod:`~.signal_check`) did to the selected classes, per class the groups (``engine backend
    shapes cache``) concerned, from the latest record of each job:

    - ``degenerate``: judged ``degenerate model`` at the headline ``revision``;
    - ``moved``: of those, the jobs that passed at another revision (a pass the rule took away);
    - ``mended``: jobs that were ``degenerate model`` at another revision and pass at the headline (a tiny model
      mended to carry signal: :func:`~.tiny.raise_init_scales` and its neighbours).

    A job degenerate at another revision that fails otherwise at the headline is in no list. ``moved`` and
    ``mended`` are empty when ``revision`` is None (every record is the headline's: no other revision)."""
    selected = _selection(records, selection)
    in_pool = [r for r in records if r["model_class"] in _pool(selected, shapes_of(r), cache_of(r))]
    at = {r["key"]: r for r in latest([r for r in in_pool if revision is None or r.get("revision") == revision])}
    before: dict[str, set[str]] = collections.defaultdict(set)
    for r in in_pool:
        if revision is not None and r.get("revision") != revision:
            before[r["key"]].add("degenerate" if _is_degenerate(r) else r["outcome"])
    out: dict[str, dict[str, list[str]]] = {"degenerate": {}, "moved": {}, "mended": {}}
    for key, r in sorted(at.items()):
        label = f"{r['engine']} {backend_of(r)} {shapes_of(r)} cache {cache_of(r)}"
        kind = "degenerate" if _is_degenerate(r) else None
        if kind:
            out["degenerate"].setdefault(r["model_class"], []).append(label)
            if "pass" in before.get(key, ()):
                out["moved"].setdefault(r["model_class"], []).append(label)
        elif r["outcome"] == "pass" and "degenerate" in before.get(key, ()):
            out["mended"].setdefault(r["model_class"], []).append(label)
    return out


def _signal_lines(summary: dict[str, Any]) -> list[str]:
    changes = summary.get("signal_changes")
    if not changes or not any(changes.values()):
        return []

    def jobs(n: int) -> str:
        return f"{n} job" if n == 1 else f"{n} jobs"

    def heading(title: str, by_class: dict[str, list[str]]) -> str:
        classes = len(by_class)
        return f"### {title}: {classes} {'class' if classes == 1 else 'classes'} ({jobs(sum(map(len, by_class.values())))})"

    def listing(by_class: dict[str, list[str]]) -> list[str]:
        return [f"- {cls} ({jobs(len(groups))}: {', '.join(groups)})" for cls, groups in sorted(by_class.items())] or ["- (none)"]

    lines = [
        "## Signal rule: degenerate and mended classes",
        "",
        "From the latest record of each job of the selection's classes (base and generative; the samples' classes are "
        "in their own sections). A job *moved* to `degenerate model` passed at another revision and fails the signal "
        "rule at the headline (the moved jobs are among the degenerate ones); a job *mended* was `degenerate model` at "
        "another revision and passes at the headline, its tiny model now carrying signal.",
    ]
    written, headline = summary.get("revision"), summary.get("headline_revision")
    if written and headline and written != headline:
        lines.append(
            f"The tiny-model builder is judged as it was at the headline revision `{headline}`; changes to it since "
            f"(this report is written at `{written}`) count here only once their jobs are rerun."
        )
    return [
        *lines,
        "",
        heading("Degenerate at the headline revision", changes["degenerate"]),
        "",
        *listing(changes["degenerate"]),
        "",
        heading("Moved to degenerate (passed at another revision)", changes["moved"]),
        "",
        *listing(changes["moved"]),
        "",
        heading("Mended back to passes (degenerate at another revision)", changes["mended"]),
        "",
        *listing(changes["mended"]),
        "",
    ]


#: stages of the sweep's own setup (before any export): failures there say nothing of the exporters
SETUP_STAGES = ("tiny config", "inputs", "eager", "signal")


def top_failure_kinds(
    records: list[dict[str, Any]], limit: int = 10, engine: str | None = None, export_side: bool = False
) -> list[dict[str, Any]]:
    """Failure kinds by the number of model classes they cost (then jobs), with example classes.

    ``records``: the headline's (:func:`headline_records`); ``engine``: only that engine's jobs; ``export_side``:
    only failures past the sweep's own setup
    (:data:`SETUP_STAGES`), i.e. in an exporter, the lowering, the runtime or the parity check.
    """
    failing = [
        r for r in latest(records)
        if r["outcome"] not in ("pass", "skip")
        and (engine is None or r.get("engine", "ours") == engine)
        and not (export_side and r.get("stage") in SETUP_STAGES)
    ]
    by_kind: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in failing:
        by_kind[r.get("kind") or "other"].append(r)
    ranked = sorted(by_kind.items(), key=lambda item: (-len({r["model_class"] for r in item[1]}), -len(item[1]), item[0]))
    out = []
    for kind, examples in ranked[:limit]:
        out.append(
            {
                "kind": kind,
                "count": len(examples),
                "classes": len({r["model_class"] for r in examples}),
                "examples": sorted({r["model_class"] for r in examples})[:5],
                "example_message": (examples[0].get("message") or "")[:200],
                "example_blamed": examples[0].get("blamed"),
            }
        )
    return out


def wilson_interval(passed: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a pass rate ``passed / total`` (95 % for ``z = 1.96``), as fractions; (0, 1)
    when ``total`` is 0."""
    if total <= 0:
        return 0.0, 1.0
    p = passed / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * ((p * (1 - p) / total + z * z / (4 * total * total)) ** 0.5) / (1 + z * z / total)
    return max(0.0, centre - half), min(1.0, centre + half)


def summarize_sample(records: list[dict[str, Any]], sample: dict[str, Any]) -> dict[str, Any]:
    """The sample of non-base classes (``sample``: a selection as :func:`summarize` takes it, the ``default`` cache kind
    only): per engine × backend of static forward jobs at one code revision (the newest record's among the sample's
    static jobs: ``revision``), pass / sample size, not run, and the pass rate over the classes run with its 95 %
    Wilson interval (:func:`wilson_interval`)."""
    selected = _selection(records, sample)
    summary = _sample_groups(records, selected, "static", ENGINES)
    if selected["generation"]:
        summary["generation"] = _sample_groups(records, selected, "generation", ("ours",))
    return summary


def _sample_groups(records: list[dict[str, Any]], selected: dict[str, Any], shapes: str, engines: tuple[str, ...]) -> dict[str, Any]:
    """:func:`summarize_sample`'s figures for one kind of job (``static`` forward jobs of the sample's forward classes,
    or ``generation`` jobs of its generation classes), from the records of one revision: the newest among them."""
    members = set(selected["forward" if shapes == "static" else "generation"])
    revision = headline_revision([r for r in records if r["model_class"] in members and shapes_of(r) == shapes])
    rows = headline_records(records, revision, selected) if revision else []
    by_group: dict[tuple[str, str], dict[str, str]] = collections.defaultdict(dict)
    for record in rows:
        if shapes_of(record) == shapes and cache_of(record) == HEADLINE_CACHE:
            by_group[(record["engine"], backend_of(record))][record["model_class"]] = record["outcome"]
    size = len(members)
    groups = []
    for engine in engines:
        for backend in BACKENDS:
            outcomes = by_group.get((engine, backend), {})
            passed = sum(o == "pass" for o in outcomes.values())
            low, high = wilson_interval(passed, len(outcomes))
            groups.append({
                "engine": engine, "backend": backend, "sample": size, "run": len(outcomes), "pass": passed,
                "fail": sum(o not in ("pass", "skip") for o in outcomes.values()), "skip": sum(o == "skip" for o in outcomes.values()),
                "not_run": size - len(outcomes),
                "pass_rate_of_run": round(passed / len(outcomes), 4) if outcomes else None,
                "interval_95": [round(low, 4), round(high, 4)] if outcomes else None,
            })
    return {"size": size, "revision": revision, "groups": groups}


def _nonbase_total(summary: dict[str, Any]) -> str:
    total, base = summary.get("classes_total"), summary.get("base_classes_total")
    return str(total - base) if isinstance(total, int) and isinstance(base, int) else "?"


def _sample_lines(summary: dict[str, Any]) -> list[str]:
    sample = summary.get("sample")
    if not sample:
        return []
    from .classes import SAMPLE_SEED

    lines = [
        "## Sample of non-base classes",
        "",
        f"A seeded random sample of **{sample['size']}** of the {_nonbase_total(summary)} classes that are not base classes "
        f"(task heads, backbones, towers; seed "
        f"{SAMPLE_SEED}, `hf-exporters sweep --classes sample`), static shapes, cache default, every figure from the records "
        f"of one code revision, `{sample.get('revision') or 'none yet'}` (the newest of the sample's). "
        "The rate over the classes run is an estimate for every non-base class, with its 95 % Wilson interval; classes "
        "not run count in `pass / sample` only.",
        "",
        "| engine | backend | pass / sample | not run | fail | pass rate of the classes run (95 % interval) |",
        "|---|---|---:|---:|---:|---|",
    ]
    lines += _sample_rows(sample["groups"])
    generation = sample.get("generation")
    if generation:
        lines += [
            "",
            "### Sample of generative classes",
            "",
            f"A seeded random sample of **{generation['size']}** of the {summary.get('generative_classes_total', '?')} "
            f"generative classes (one per model type; seed {SAMPLE_SEED}, `hf-exporters sweep --classes sample --shapes "
            "generation`), generation jobs (token ids of greedy `generate()` against eager), every figure from the records "
            f"of one code revision, `{generation.get('revision') or 'none yet'}` (the newest of the sample's generation "
            "records). These classes are also in the headline's generation rows, which count every generative class.",
            "",
            "| engine | backend | pass / sample | not run | fail | pass rate of the classes run (95 % interval) |",
            "|---|---|---:|---:|---:|---|",
            *_sample_rows(generation["groups"]),
        ]
    return [*lines, ""]


def _sample_rows(groups: list[dict[str, Any]]) -> list[str]:
    rows = []
    for g in groups:
        if g["run"]:
            low, high = g["interval_95"]
            rate = f"{100 * g['pass_rate_of_run']:.1f}% of {g['run']} ({100 * low:.1f}-{100 * high:.1f}%)"
        else:
            rate = "none run"
        rows.append(f"| {g['engine']} | {g['backend']} | {g['pass']} / {g['sample']} | {g['not_run']} | {g['fail']} | {rate} |")
    return rows


def write_reports(
    directory: Path, records: list[dict[str, Any]], meta: dict[str, Any],
    selection: dict[str, list[str]] | None = None, revision: str | None = None, sample: dict[str, Any] | None = None,
    universe: list[str] | None = None,
) -> dict[str, Any]:
    """Write ``summary.json``, ``report.md`` and ``pass_rates.png`` into ``directory``; return the summary.

    Every figure of the headline comes from the records of one code revision (``revision``, else the newest
    record's: :func:`headline_revision`) and counts every selected class (``selection``, see :func:`summarize`);
    records of other revisions are counted as history only. ``sample``: the selection of the non-base sample,
    reported in its own section (:func:`summarize_sample`); ``universe``: every model class, the ``all classes`` row of
    the headline table (:func:`summarize_scopes`)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    summary = summarize(records, meta, selection, revision)
    if sample is not None:
        summary["sample"] = summarize_sample(records, sample)
    rows = headline_records(records, summary["headline_revision"], _selection(records, selection))
    summary["top_failure_kinds"] = top_failure_kinds(rows)
    summary["top_export_failure_kinds"] = top_failure_kinds(rows, engine="ours", export_side=True)
    summary["engine_differences"] = compare_engines(rows)
    summary["signal_changes"] = signal_changes(records, summary["headline_revision"], selection)
    summary["scopes"] = summarize_scopes(records, summary, universe)
    (directory / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n")
    (directory / "report.md").write_text(render_markdown(summary))
    write_chart(directory / "pass_rates.png", summary)
    return summary


def _kinds_table(items: list[dict[str, Any]]) -> list[str]:
    lines = ["| kind | classes | jobs | example classes | example message |", "|---|---:|---:|---|---|"]
    for item in items:
        message = item["example_message"].replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {item['kind']} | {item.get('classes', '?')} | {item['count']} | {', '.join(item['examples'])} | {message} |")
    return lines


def _one_set_lines(summary: dict[str, Any]) -> list[str]:
    """A line per dynamic group naming the passes checked on the exported sizes alone (no grown input
    set the program takes, or one eager itself refuses)."""
    lines = []
    for g in summary["groups"].values():
        names = sorted(g.get("passes_on_one_input_set", []))
        if names:
            shown = ", ".join(names[:12]) + (f", ... ({len(names) - 12} more)" if len(names) > 12 else "")
            lines.append(f"- {g['engine']} {g['backend']} {g['shapes']} cache {g.get('cache', 'off')}: {len(names)} of {g['pass']} passes ran one input set only: {shown}.")
    return ([*lines, ""] if lines else [])


def render_markdown(summary: dict[str, Any]) -> str:
    lines = [
        f"# Export sweep — transformers {summary.get('versions', {}).get('transformers', '?')}",
        "",
        "Generated by `hf-exporters sweep`; do not edit by hand.",
        "",
        f"- Model classes reachable from the Auto mappings: **{summary.get('classes_total', '?')}** "
        f"({summary.get('base_classes_total', '?')} base model classes, one per model type).",
        f"- Classes selected: **{summary.get('classes_selected', '?')}** ({summary.get('class_set', '?')}); "
        f"generation mode: **{summary.get('generation_classes_selected', '?')}** of "
        f"{summary.get('generative_classes_total', '?')} generative classes (one per model type). Every selected class "
        "is in every denominator of its mode: a class with no record in a group is counted `not run`.",
        f"- Headline revision: `{summary.get('headline_revision') or 'any (records name none)'}`"
        f"{' (chosen with --headline-revision)' if summary.get('headline_revision_requested') else ' (the newest forward record' + chr(39) + 's among the selected classes)'}: "
        f"every figure below comes from its **{summary.get('records_headline', summary['jobs_recorded'])}** records "
        f"({summary['jobs_recorded']} jobs of selected classes; classes with a record: {summary['classes_run']} forward, "
        f"{summary.get('generation_classes_run', 0)} generation"
        + (f"; {summary['records_outside_selection']} records of classes outside the selection, the non-base sample's among them, count in no headline figure" if summary.get("records_outside_selection") else "")
        + f"). **{summary.get('records_history', 0)}** records of {summary.get('revisions_history', 0)} other revisions are kept as "
        "history only (last section).",
        f"- Versions: {', '.join(f'{k} {v}' for k, v in summary.get('versions', {}).items())}; this report written at code revision `{summary.get('revision', '?')}`.",
        f"- Command(s) at the headline revision: {'; '.join('`' + r.get('command', '') + '`' for r in _headline_runs(summary)) or 'none recorded'}"
        + (f" ({len(summary.get('runs', [])) - len(_headline_runs(summary))} runs under other revisions in runs.jsonl)." if len(summary.get("runs", [])) > len(_headline_runs(summary)) else "."),
        "- A pass is numeric parity within the backend's tolerance on every output element, in the backend's real "
        "runtime (torch.export.load / onnxruntime / executorch.runtime), of a model whose eager outputs carry signal; each "
        "record gives the largest absolute difference (`max_abs_diff`) and the relative one (`max_rel_diff`: per output, "
        "max abs diff / max |eager|, the largest). Upstream's artifacts run the way upstream runs them: on the inputs as "
        "its `prepare_for_export` left them (the `cu_seqlens`, `position_ids`, ... it precomputes), eager on the sweep's "
        "own. Dynamic jobs ask every axis to be dynamic, "
        "also run a second input set whose batch and length axes grew (the same set for both engines), and fail when the batch axis or the length axis of "
        "token ids, masks or raw audio ended static (other axes the model fixes are listed, not failed). Generation jobs (shapes "
        "`generation`, one generative class per model type, our engine only) export the prefill/decode (and encoder) "
        "parts, generate 8 greedy tokens from the written folder in the runtime and pass when the ids equal eager `generate()`.",
        f"- Cache kinds: the headline rate is the **cache {HEADLINE_CACHE}** kind's: every forward job builds its model with "
        "`use_cache` as the config has it, so a decoder returns its cache and every tensor of that cache is compared with "
        "eager (and judged by the signal rule) like any other output; generation jobs are of this kind. Classes whose config "
        "(or a sub-config) has a `use_cache` field also run the **cache off** kind (`use_cache=False` in the config and its "
        "sub-configs, the only kind before cache kinds existed; records without a cache kind are of it), shown beside it. "
        f"Classes planned per kind: {', '.join(f'{k} {v}' for k, v in summary.get('cache_classes_selected', {}).items()) or 'none'}.",
        f"- Signal rule (forward jobs; records carry the figures as `signal`: per output max |x|, std and the change "
        f"between the two input sets): {RULE}.",
        "",
        "## Pass rates",
        "",
        f"The headline, cache {HEADLINE_CACHE}, at the headline revision: per scope (the selected base classes, every "
        "model class, the generative classes), pass / the scope's classes, and how many of them have no record at the "
        "headline revision (not run, counted in the denominator; the rate over the classes run beside it):",
        "",
        *_scope_table(summary),
        "",
        f"The forward groups by cache kind (the headline: cache {HEADLINE_CACHE}). Side by side:",
        "",
        *_kinds_side_by_side(summary),
        "",
        "Every group:",
        "",
        *_table(summary),
        "",
        *_not_run_lines(summary),
        *_one_set_lines(summary),
        "![pass rates](pass_rates.png)",
        "",
        *_sample_lines(summary),
        "## Top failure kinds",
        "",
        "By the number of model classes they cost (a class counts once however many of its jobs failed so).",
        "",
        *_kinds_table(summary.get("top_failure_kinds", [])),
        "",
        "### Export-side failures of our engine",
        "",
        "Past the sweep's own setup (tiny config, inputs, eager, signal): in an exporter stage, the lowering, the runtime "
        "or the parity check.",
        "",
        *_kinds_table(summary.get("top_export_failure_kinds", [])),
    ]
    diff = summary.get("engine_differences", {})
    lines += ["", "## Engines side by side", ""]
    lines.append(f"### We pass, upstream (transformers.exporters) fails: {len(diff.get('ours_pass_upstream_fails', []))}")
    lines.append("")
    lines += [f"- {x}" for x in diff.get("ours_pass_upstream_fails", [])[:100]] or ["- (none)"]
    lines.append("")
    lines.append(f"### Upstream passes, we fail: {len(diff.get('upstream_pass_ours_fails', []))}")
    lines.append("")
    lines += [f"- {x}" for x in diff.get("upstream_pass_ours_fails", [])[:100]] or ["- (none)"]
    lines.append("")
    lines += _signal_lines(summary)
    lines += _history_table(summary)
    return "\n".join(lines)


def _headline_runs(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs (runs.jsonl) made at the headline revision."""
    revision = summary.get("headline_revision")
    return [r for r in summary.get("runs", []) if revision is None or r.get("revision") == revision]


# ── PNG chart without a plotting library ────────────────────────────────────

_FONT = {  # 3x5 glyphs, rows top to bottom, 3 bits each
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111", "3": "111001111001111",
    "4": "101101111001001", "5": "111100111001111", "6": "111100111101111", "7": "111001001001001",
    "8": "111101111101111", "9": "111101111001111", "%": "101001010100101", ".": "000000000000010",
    " ": "000000000000000", "-": "000000111000000", "/": "001001010100100", "|": "010010010010010",
    "A": "010101111101101", "B": "110101110101110", "C": "111100100100111", "D": "110101101101110",
    "E": "111100110100111", "F": "111100110100100", "G": "111100101101111", "H": "101101111101101",
    "I": "111010010010111", "J": "001001001101111", "K": "101101110101101", "L": "100100100100111",
    "M": "101111111101101", "N": "110101101101101", "O": "111101101101111", "P": "111101111100100",
    "Q": "111101101111001", "R": "110101110101101", "S": "111100111001111", "T": "111010010010010",
    "U": "101101101101111", "V": "101101101101010", "W": "101101111111101", "X": "101101010101101",
    "Y": "101101010010010", "Z": "111001010100111", "=": "000111000111000", ":": "000010000010000",
}


def _png(path: Path, pixels: list[bytearray], width: int, height: int) -> None:
    import struct
    import zlib

    raw = b"".join(b"\x00" + bytes(row) for row in pixels)

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    data += chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
    path.write_bytes(data)


def write_chart(path: Path, summary: dict[str, Any]) -> None:
    """A grouped bar chart: one group per backend × shapes × cache kind (named on a second line under the bars), one
    bar per engine (ours blue, upstream orange)."""
    colors = {"ours": (31, 119, 180), "upstream": (255, 127, 14)}
    groups: dict[str, dict[str, float]] = collections.OrderedDict()
    for g in summary["groups"].values():
        label = f"{g['backend']} {({'dynamic': 'dyn', 'generation': 'gen'}).get(g.get('shapes', ''), 'dyn' if g['dynamic'] else 'static')}".upper()
        label += f"|CACHE {g.get('cache', 'off')}".upper()  # the cache kind on a second line
        groups.setdefault(label, {})[g["engine"]] = g["pass_rate"]
    scale = 2
    bar_w, gap, plot_h, left, top, bottom = 28, 24, 200, 40, 30, 40
    width = left + max(1, len(groups)) * (2 * bar_w + gap) + gap
    height = top + plot_h + bottom
    pixels = [bytearray(b"\xff\xff\xff" * width) for _ in range(height)]

    def rect(x0: int, y0: int, x1: int, y1: int, color: tuple[int, int, int]) -> None:
        for y in range(max(0, y0), min(height, y1)):
            for x in range(max(0, x0), min(width, x1)):
                pixels[y][3 * x : 3 * x + 3] = bytes(color)

    def text(x: int, y: int, s: str, color: tuple[int, int, int] = (0, 0, 0), size: int = 1) -> None:
        for ch in s.upper():
            glyph = _FONT.get(ch, _FONT[" "])
            for row in range(5):
                for col in range(3):
                    if glyph[row * 3 + col] == "1":
                        rect(x + col * size, y + row * size, x + (col + 1) * size, y + (row + 1) * size, color)
            x += 4 * size

    for pct in (0, 25, 50, 75, 100):
        y = top + plot_h - plot_h * pct // 100
        rect(left, y, width - gap // 2, y + 1, (220, 220, 220))
        text(4, y - 2, f"{pct}%")
    x = left + gap
    for label, by_engine in groups.items():
        for i, engine in enumerate(ENGINES):
            rate = by_engine.get(engine)
            if rate is None:
                continue
            h = int(round(plot_h * rate))
            bx = x + i * bar_w
            rect(bx, top + plot_h - h, bx + bar_w - 2, top + plot_h, colors[engine])
            text(bx + 1, top + plot_h - h - 8, f"{round(100 * rate)}")
        first, _, second = label.partition("|")
        text(x, top + plot_h + 8, first[: (2 * bar_w) // 4])
        text(x, top + plot_h + 16, second[: (2 * bar_w) // 4])
        x += 2 * bar_w + gap
    rect(left, top + plot_h, width - gap // 2, top + plot_h + 1, (0, 0, 0))
    text(left, 8, "PASS RATE", (0, 0, 0), 2)
    rect(left + 90, 10, left + 98, 18, colors["ours"])
    text(left + 101, 12, "OURS")
    rect(left + 125, 10, left + 133, 18, colors["upstream"])
    text(left + 136, 12, "UPSTREAM")
    del scale
    _png(path, pixels, width, height)
