"""Reports of a sweep: summary.json, report.md and a PNG chart of the pass rates, from results.jsonl."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

from .job import BACKENDS, ENGINES

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


def shapes_of(record: dict[str, Any]) -> str:
    """``static``, ``dynamic`` or ``generation`` (token-id parity of a generation-mode job)."""
    return "generation" if record.get("mode") == "generation" else ("dynamic" if record["dynamic"] else "static")


def backend_of(record: dict[str, Any]) -> str:
    """The backend, ``executorch (cpp)`` for ExecuTorch jobs run on the C++ runner."""
    return f"{record['backend']} (cpp)" if record.get("runtime") == "cpp" else record["backend"]


def _group(record: dict[str, Any]) -> str:
    return f"{record['engine']}|{backend_of(record)}|{shapes_of(record)}"


def _failure_stage(record: dict[str, Any]) -> str:
    if record["outcome"] in ("timeout", "crash", "oom"):
        return record["outcome"]
    stage = record.get("stage") or "unknown"
    return stage


def summarize(records: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """Per engine × backend × dynamic: total, pass, skip, failures by stage and by kind, pass rate."""
    rows = latest(records)
    groups: dict[str, dict[str, Any]] = {}
    order = {"static": 0, "dynamic": 1, "generation": 2}
    for record in sorted(rows, key=lambda r: (ENGINES.index(r["engine"]) if r["engine"] in ENGINES else 9, r["backend"], order[shapes_of(r)])):
        g = groups.setdefault(
            _group(record),
            {
                "engine": record["engine"],
                "backend": backend_of(record),
                "dynamic": record["dynamic"],
                "shapes": shapes_of(record),
                "total": 0,
                "pass": 0,
                "skip": 0,
                "fail": 0,
                "failures_by_stage": collections.Counter(),
                "failures_by_kind": collections.Counter(),
                "passes_on_one_input_set": [],
            },
        )
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
            g["failures_by_stage"][_failure_stage(record)] += 1
            g["failures_by_kind"][record.get("kind") or "other"] += 1
    for g in groups.values():
        g["pass_rate"] = round(g["pass"] / g["total"], 4) if g["total"] else 0.0
        g["failures_by_stage"] = dict(g["failures_by_stage"].most_common())
        g["failures_by_kind"] = dict(g["failures_by_kind"].most_common())
    classes_run = sorted({r["model_class"] for r in rows if r.get("mode") != "generation"})
    generation_run = sorted({r["model_class"] for r in rows if r.get("mode") == "generation"})
    return {
        **meta,
        "classes_run": len(classes_run),
        "generation_classes_run": len(generation_run),
        "jobs_recorded": len(rows),
        "groups": groups,
    }


def _table(summary: dict[str, Any]) -> list[str]:
    lines = [
        "| engine | backend | shapes | total | pass | skip | fail | pass rate | failures by stage |",
        "|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for g in summary["groups"].values():
        stages = ", ".join(f"{k} {v}" for k, v in list(g["failures_by_stage"].items())[:5])
        lines.append(
            f"| {g['engine']} | {g['backend']} | {g.get('shapes', 'dynamic' if g['dynamic'] else 'static')} | {g['total']} | {g['pass']} | "
            f"{g['skip']} | {g['fail']} | {100 * g['pass_rate']:.1f}% | {stages} |"
        )
    return lines


def compare_engines(records: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Jobs (class, backend, shapes) that pass with ours and fail upstream, and the reverse."""
    by = {(r["engine"], backend_of(r), shapes_of(r), r["model_class"]): r["outcome"] for r in latest(records)}
    ours_only, upstream_only = [], []
    for (engine, backend, shapes, cls), outcome in sorted(by.items()):
        if engine != "ours":
            continue
        other = by.get(("upstream", backend, shapes, cls))
        if other is None:
            continue
        label = f"{cls} ({backend}, {shapes})"
        if outcome == "pass" and other != "pass":
            ours_only.append(label)
        elif other == "pass" and outcome not in ("pass", "skip"):
            upstream_only.append(label)
    return {"ours_pass_upstream_fails": ours_only, "upstream_pass_ours_fails": upstream_only}


#: stages of the sweep's own setup (before any export): failures there say nothing of the exporters
SETUP_STAGES = ("tiny config", "inputs", "eager")


def top_failure_kinds(
    records: list[dict[str, Any]], limit: int = 10, engine: str | None = None, export_side: bool = False
) -> list[dict[str, Any]]:
    """Failure kinds by the number of model classes they cost (then jobs), with example classes.

    ``engine``: only that engine's jobs; ``export_side``: only failures past the sweep's own setup
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


def write_reports(directory: Path, records: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """Write ``summary.json``, ``report.md`` and ``pass_rates.png`` into ``directory``; return the summary."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    summary = summarize(records, meta)
    summary["top_failure_kinds"] = top_failure_kinds(records)
    summary["top_export_failure_kinds"] = top_failure_kinds(records, engine="ours", export_side=True)
    summary["engine_differences"] = compare_engines(records)
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
            lines.append(f"- {g['engine']} {g['backend']} {g['shapes']}: {len(names)} of {g['pass']} passes ran one input set only: {shown}.")
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
        f"classes run: **{summary['classes_run']}**; jobs recorded: **{summary['jobs_recorded']}**.",
        f"- Generation mode: **{summary.get('generative_classes_total', '?')}** generative classes (one per model type); "
        f"run: **{summary.get('generation_classes_run', 0)}**.",
        f"- Versions: {', '.join(f'{k} {v}' for k, v in summary.get('versions', {}).items())}; code revision `{summary.get('revision', '?')}`.",
        f"- Command(s): {'; '.join('`' + r.get('command', '') + '`' for r in summary.get('runs', [])) or '?'}",
        "- A pass is numeric parity within the backend's tolerance on every output element, in the backend's real "
        "runtime (torch.export.load / onnxruntime / executorch.runtime); dynamic jobs ask every axis to be dynamic, "
        "also run a second input set whose batch and length axes grew (the same set for both engines), and fail when the batch axis or the length axis of "
        "token ids, masks or raw audio ended static (other axes the model fixes are listed, not failed). Generation jobs (shapes "
        "`generation`, one generative class per model type, our engine only) export the prefill/decode (and encoder) "
        "parts, generate 8 greedy tokens from the written folder in the runtime and pass when the ids equal eager `generate()`.",
        "",
        "## Pass rates",
        "",
        *_table(summary),
        "",
        *_one_set_lines(summary),
        "![pass rates](pass_rates.png)",
        "",
        "## Top failure kinds",
        "",
        "By the number of model classes they cost (a class counts once however many of its jobs failed so).",
        "",
        *_kinds_table(summary.get("top_failure_kinds", [])),
        "",
        "### Export-side failures of our engine",
        "",
        "Past the sweep's own setup (tiny config, inputs, eager): in an exporter stage, the lowering, the runtime "
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
    return "\n".join(lines)


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
    """A grouped bar chart: one group per backend × shapes, one bar per engine (ours blue, upstream orange)."""
    colors = {"ours": (31, 119, 180), "upstream": (255, 127, 14)}
    groups: dict[str, dict[str, float]] = collections.OrderedDict()
    for g in summary["groups"].values():
        label = f"{g['backend']} {({'dynamic': 'dyn', 'generation': 'gen'}).get(g.get('shapes', ''), 'dyn' if g['dynamic'] else 'static')}".upper()
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
        text(x, top + plot_h + 8, label[: (2 * bar_w) // 4])
        x += 2 * bar_w + gap
    rect(left, top + plot_h, width - gap // 2, top + plot_h + 1, (0, 0, 0))
    text(left, 8, "PASS RATE", (0, 0, 0), 2)
    rect(left + 90, 10, left + 98, 18, colors["ours"])
    text(left + 101, 12, "OURS")
    rect(left + 125, 10, left + 133, 18, colors["upstream"])
    text(left + 136, 12, "UPSTREAM")
    del scale
    _png(path, pixels, width, height)
