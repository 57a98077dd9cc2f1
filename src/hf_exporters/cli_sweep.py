"""``hf-exporters sweep``: every model class through every backend, with a report (see :mod:`hf_exporters.sweep`)."""

from __future__ import annotations

import json
import os
import shlex
import tempfile
import sys
import time
from pathlib import Path
from typing import Optional

import typer


def _split(value: str, allowed: tuple[str, ...], option: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad:
        raise typer.BadParameter(f"{option}: unknown {', '.join(bad)}; choose from {', '.join(allowed)}")
    return items


def sweep(
    backend: str = typer.Option("dynamo,onnx,executorch", "--backend", "-b", help="Comma-separated backends."),
    engine: str = typer.Option("ours", "--engine", help="ours | upstream | both (upstream: transformers.exporters)."),
    shapes: str = typer.Option(
        "static,dynamic", "--shapes",
        help="static, dynamic, generation (comma-separated; static runs first). generation: one generative class per "
        "model type, token-id parity of 8 greedy tokens generated from the exported folder (our engine only).",
    ),
    cache: str = typer.Option(
        "default,off", "--cache",
        help="Cache kinds of forward jobs (comma-separated): default (use_cache as the model's config has it: a returned "
        "cache is compared leaf by leaf; the headline) and off (use_cache=False). A class whose config has no use_cache "
        "field runs once, as default. With --smoke, default runs for the smoke set's cache classes only.",
    ),
    classes: str = typer.Option(
        "base", "--classes",
        help="base (one base model class per model type) | all (every Auto-mapping class) | sample (a seeded random sample "
        "of 400 non-base classes, and with --shapes generation of 100 generative classes, reported as samples with their "
        "95% intervals; the report's headline stays the base and every generative class).",
    ),
    only: Optional[str] = typer.Option(None, "--only", help="Comma-separated fnmatch patterns on class name or model type."),
    shard: Optional[str] = typer.Option(None, "--shard", help="i/n: run every n-th class starting at i (0-based)."),
    jobs: int = typer.Option(1, "--jobs", "-j", help="Jobs run at the same time (local process pool)."),
    timeout: float = typer.Option(90.0, "--timeout", help="Seconds per job before it is killed and recorded as a timeout."),
    memory_gb: float = typer.Option(6.0, "--memory-gb", help="Resident memory cap per job (GiB); past it the job is an oom."),
    ray: Optional[str] = typer.Option(None, "--ray", help="Ray cluster address ('local' starts one here); needs the ray extra."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Report folder (default reports/sweep/<transformers version>)."),
    recheck_skips: bool = typer.Option(False, "--recheck-skips", help="Run the EXPORT_SKIPS entries and list those that now pass."),
    smoke: bool = typer.Option(False, "--smoke", help="The CI smoke set; fails on a regression against the baseline."),
    update_baseline: bool = typer.Option(False, "--update-baseline", help="With --smoke: write the baseline from this run."),
    resume: bool = typer.Option(True, "--resume/--no-resume", help="Skip jobs already recorded under the same versions and code revision."),
    any_revision: bool = typer.Option(False, "--resume-any-revision", help="Resume past jobs recorded under another code revision (same versions); the summary lists every revision."),
    retry: Optional[str] = typer.Option(
        None, "--retry",
        help="Comma-separated stages or outcomes whose recorded jobs run again: 'setup' (tiny config, inputs, eager, signal: "
        "after a change to the sweep's own setup), a stage name, timeout, crash, oom.",
    ),
    report_only: bool = typer.Option(False, "--report-only", help="Only regenerate the reports from results.jsonl."),
    headline_revision: Optional[str] = typer.Option(
        None, "--headline-revision",
        help="The code revision whose records make the report's headline (default: the newest forward record's); records of "
        "other revisions are counted as history only.",
    ),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
    runtime: str = typer.Option("python", "--runtime", help="ExecuTorch jobs: python (executorch.runtime) | cpp (the C++ runner, make cpp); recorded as its own jobs."),
) -> None:
    """Export model classes of the installed transformers through each backend and report parity pass rates."""
    from .known_issues import skip_reason
    from .sweep import classes as class_sets
    from .sweep import report, runner
    from .sweep import smoke as smoke_set
    from .sweep.job import BACKENDS, CACHE_KINDS, ENGINES, class_has_use_cache

    backends = _split(backend, BACKENDS, "--backend")
    engines = list(ENGINES) if engine == "both" else _split(engine, ENGINES, "--engine")
    shape_modes = _split(shapes, ("static", "dynamic", "generation"), "--shapes")
    cache_modes = [v.strip() for v in cache.split(",") if v.strip()]
    unknown_kinds = [v for v in cache_modes if v not in CACHE_KINDS]
    if unknown_kinds or not cache_modes:
        what = f"unknown cache kind {', '.join(unknown_kinds)}" if unknown_kinds else "no cache kind named"
        typer.echo(f"error: --cache {cache}: {what}; choose from {', '.join(CACHE_KINDS)} (comma-separated)", err=True)
        raise typer.Exit(1)
    dynamics = [s == "dynamic" for s in shape_modes if s != "generation"]
    generation = "generation" in shape_modes
    import transformers

    all_classes = class_sets.all_classes()
    base = class_sets.base_classes()
    if classes not in ("base", "all", "sample"):
        raise typer.BadParameter(f"--classes: unknown {classes}; choose from base, all, sample")
    sample = class_sets.nonbase_sample()
    pool = all_classes if classes == "all" else sample if classes == "sample" else base
    if smoke:
        pool = {c: all_classes.get(c, base.get(c, "")) for c in smoke_set.smoke_classes()}
    generative = class_sets.generative_classes()
    generative_sample = class_sets.generative_sample()
    gen_pool = generative if classes != "all" or not generation else {c: t for c, t in all_classes.items() if c in generative}
    if classes == "sample":
        gen_pool = generative_sample
    if smoke and generation:
        gen_pool = {c: t for c, t in pool.items() if c in generative}
    try:
        selected = class_sets.select(pool, only, shard) if dynamics else []
        gen_selected = class_sets.select(gen_pool, only, shard) if generation else []
    except ValueError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None

    def chosen(classes_pool: dict[str, str]) -> list[str]:
        try:
            return class_sets.select(classes_pool, only, shard)
        except ValueError:  # --only names classes of the other mode only
            return []

    # the report's denominators: every class the options select, in either mode, whichever shapes this run asks for
    # (--classes sample: every base class, whatever --only picks of the sample; the sample has its own section)
    report_selection = {
        "forward": sorted(base) if classes == "sample" else chosen(pool),
        "generation": sorted(generative) if classes == "sample" else chosen(gen_pool if not smoke else {c: t for c, t in pool.items() if c in generative}),
    }
    # cache kinds: default for every class, off for a class whose config has use_cache (its config built once here)
    fields: dict[str, bool] = {}

    def has_field(class_name: str) -> bool:
        if class_name not in fields:
            fields[class_name] = class_has_use_cache(class_name)
        return fields[class_name]

    kinds_of = runner.cache_kinds_for(cache_modes, has_field, smoke_set.SMOKE_DEFAULT_CACHE if smoke else None)
    report_selection["cache"] = {
        kind: [c for c in report_selection["forward"] if kind in kinds_of(c)] for kind in CACHE_KINDS
    }
    out_dir = output or Path("reports") / "sweep" / transformers.__version__
    if smoke and output is None:
        out_dir = Path("reports") / "sweep" / "smoke" / transformers.__version__
    if runtime not in ("python", "cpp"):
        typer.echo(f"error: --runtime {runtime}: choose python or cpp", err=True)
        raise typer.Exit(1)
    try:  # before anything is written: a folder of a sweep's own files only, and one sweep at a time
        folder_lock = runner.claim_output(out_dir)
    except runner.OutputFolderError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None
    with folder_lock:  # held until the reports are written, released however the sweep ends
        store = runner.ResultStore(out_dir / "results.jsonl", runner.versions(), runner.code_revision())

        def ours_skip(cls: str, be: str, dyn: bool) -> str | None:
            return skip_reason(cls, be, dyn)

        import hashlib

        # a partial run samples every family: classes in a fixed pseudo-random order, not alphabetical
        ordered = sorted(selected, key=lambda c: hashlib.sha1(c.encode()).hexdigest())
        specs = runner.plan([(c, pool[c]) for c in ordered], backends, engines, dynamics, ours_skip, recheck_skips, kinds_of)
        if generation:
            gen_ordered = sorted(gen_selected, key=lambda c: hashlib.sha1(c.encode()).hexdigest())
            specs += runner.plan([(c, gen_pool[c]) for c in gen_ordered], backends, ["ours"], ["generation"], ours_skip, recheck_skips)
        specs = [s for s in specs if not (s.get("skip") and s["engine"] != "ours")]
        for s in specs:  # EXPORT_SKIPS are ours: upstream runs every job
            if s["engine"] != "ours":
                s.pop("skip", None)
                s.pop("recheck", None)
        if recheck_skips:
            specs = [s for s in specs if s.get("recheck")]
        if runtime == "cpp":
            for s in specs:
                s["runtime"] = "cpp"
        retry_stages = {t.strip() for t in (retry or "").split(",") if t.strip()}
        if "setup" in retry_stages:
            retry_stages |= set(runner.CLASS_STAGES)
        done = store.done(any_revision, retry_stages) if resume else set()
        pending = [s for s in specs if runner.job_key(s) not in done]
        command = "hf-exporters sweep " + " ".join(shlex.quote(a) for a in sys.argv[1:] if a != "sweep")
        typer.echo(
            f"{len(all_classes)} model classes in the Auto mappings ({len(base)} base"
            + f", {len(generative)} generative"
            + f"); {len(selected) + len(gen_selected)} selected; "
            f"{len(specs)} jobs, {len(specs) - len(pending)} already done; writing {out_dir}",
            err=True,
        )
        records: list = []
        if not report_only and pending:
            with open(out_dir / "runs.jsonl", "a") as handle:  # the exact options, recorded before the run
                handle.write(json.dumps({
                    "command": command, "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "jobs_planned": len(pending),
                    "revision": store.revision,
                    "options": {"backend": backends, "engine": engines, "shapes": shapes, "cache": cache_modes, "classes": classes, "only": only,
                                "shard": shard, "jobs": jobs, "timeout": timeout, "memory_gb": memory_gb, "ray": ray,
                                "recheck_skips": recheck_skips, "smoke": smoke, "resume": resume,
                                "resume_any_revision": any_revision, "runtime": runtime, "retry": retry},
                }) + "\n")
            try:
                records = runner.run_jobs(
                    pending, store, jobs=jobs, timeout=timeout, memory_gb=memory_gb, ray_address=ray, progress=progress,
                    log=Path(tempfile.gettempdir()) / f"hf-sweep-jobs-{os.getpid()}.log",  # the models' own output
                )
            except runner.SweepInterrupted as stopped:
                typer.echo(
                    f"error: sweep stopped by {stopped.name}: its running jobs were killed and not recorded; "
                    f"{len(store.records())} records kept in {store.path}; rerun the command to resume",
                    err=True,
                )
                raise typer.Exit(128 + stopped.signum) from None
        runs = [json.loads(line) for line in (out_dir / "runs.jsonl").read_text().splitlines()] if (out_dir / "runs.jsonl").exists() else []
        meta = {
            "versions": store.versions,
            "revision": store.revision,
            "classes_total": len(all_classes),
            "base_classes_total": len(base),
            "class_set": "smoke" if smoke else ("base" if classes == "sample" else classes),
            "classes_selected": len(report_selection["forward"]),
            "generative_classes_total": len(generative),
            "runs": runs,
            "revisions_recorded": sorted({r.get("revision", "?") for r in store.records()}),
        }
        sample_selection = None if smoke else {
            "forward": sorted(sample), "generation": sorted(generative_sample), "cache": {"default": sorted(sample), "off": []}
        }
        summary = report.write_reports(
            out_dir, store.records(), meta, report_selection, headline_revision, sample_selection,
            universe=None if smoke or only or shard else sorted(all_classes),  # the all-classes row: unfiltered runs
        )
        typer.echo(
            f"headline revision {summary['headline_revision']}: {summary['records_headline']} records; "
            f"{summary['records_history']} records of {summary['revisions_history']} other revisions kept as history only",
            err=True,
        )
        for g in summary["groups"].values():
            typer.echo(
                f"{g['engine']:>8} {g['backend']:>10} {g.get('shapes', 'dynamic' if g['dynamic'] else 'static'):>10} "
                f"cache {g.get('cache', 'off'):<7}{' (headline)' if g.get('headline') else '           '}: "
                f"{g['pass']}/{g['selected']} pass ({100 * g['pass_rate']:.1f}%), {g['skip']} skip, {g['fail']} fail "
                f"({g['degenerate']} degenerate), {g['not_run']} not run"
            )
        if recheck_skips:
            now_pass = sorted({f"{r['model_class']} ({r['backend']}, {'dynamic' if r['dynamic'] else 'static'}, cache {r.get('cache', 'off')})" for r in records if r["outcome"] == "pass"})
            typer.echo("EXPORT_SKIPS entries that now pass (remove them):" if now_pass else "no EXPORT_SKIPS entry passes yet")
            for line in now_pass:
                typer.echo(f"  {line}")
        if smoke:
            latest = report.latest([r for r in store.records() if r.get("revision") == store.revision])
            if update_baseline:
                smoke_set.write_baseline(latest)
                typer.echo(f"baseline written: {smoke_set.BASELINE}")
            else:
                planned = {runner.job_key(s) for s in specs}
                bad = smoke_set.regressions(latest, smoke_set.load_baseline(), planned)
                if bad:
                    typer.echo("smoke sweep regressions:\n  " + "\n  ".join(bad), err=True)
                    raise typer.Exit(1)
                typer.echo("smoke sweep: no regression against the baseline")


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)
