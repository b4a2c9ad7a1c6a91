"""The fidelity suite's verdicts and its Markdown: every number with its spread, misses said plainly.

Targets (issue 17), over the rounds' median errors of the cases whose ground truth is stable:
sleep-compute mean |error| <= 0.5 %, every case <= 2 %, memory difference 0 B; real-compute every
case <= 3 % with an inter-quartile range of its round errors under 2 %. A case with an unstable
ground truth (`compare.STABLE_REAL_IQR_PCT`) is reported and named, and left out of the targets.
"""

from __future__ import annotations

import statistics

from benchmarks.common import EVERY_PACKAGE, machine_line
from benchmarks.fidelity import stats

TARGETS = {
    "sleep_compute": {"mean_abs_error_pct": 0.5, "max_abs_error_pct": 2.0, "memory_diff_bytes": 0},
    "real_compute": {"max_abs_error_pct": 3.0, "max_error_iqr_pct": 2.0},
}


def model_round_errors(record: dict, model: str) -> list[float]:
    """The case's error per round under `model`: the mean over its real ranks."""
    ranks = record["models"][model]["ranks"]
    return [statistics.fmean(column) for column in zip(*(r["round_errors_pct"] for r in ranks), strict=True)]


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _kind_summary(records: list[dict], model: str) -> dict:
    medians = {r["case"]: stats.spread(model_round_errors(r, model))["median"] for r in records}
    iqrs = {r["case"]: stats.spread(model_round_errors(r, model))["iqr"] for r in records}
    return {
        "median_error_pct": medians,
        "error_iqr_pct": iqrs,
        "mean_abs_error_pct": statistics.fmean(abs(m) for m in medians.values()) if medians else None,
        "max_abs_error_pct": max((abs(m) for m in medians.values()), default=None),
    }


def summarize(records: list[dict]) -> dict:
    """Per kind of case: the stable cases' numbers under each model, and the verdicts (job model)."""
    out: dict = {}
    for kind, key in (("sleep-compute", "sleep_compute"), ("real-compute", "real_compute")):
        of_kind = [r for r in records if r["kind"] == kind]
        if not of_kind:
            continue
        stable = [r for r in of_kind if r["stable"]]
        models = sorted({m for r in of_kind for m in r["models"]})
        section = {
            "cases": [r["case"] for r in of_kind],
            "unstable_cases": [r["case"] for r in of_kind if not r["stable"]],
            "models": {m: _kind_summary(stable, m) for m in models},
            "cases_with_memory_diff": [r["case"] for r in of_kind if r["memory_diff_bytes"] != 0],
        }
        section["verdicts"] = _verdicts(key, section, stable)
        out[key] = section
    return out


def _verdicts(key: str, section: dict, stable: list[dict]) -> dict[str, str]:
    job, target = section["models"].get("job"), TARGETS[key]
    if not stable or job is None:
        return {"all": "no stable case: nothing judged"}
    if key == "sleep_compute":
        return {
            "mean_abs_error_pct": _verdict(job["mean_abs_error_pct"] <= target["mean_abs_error_pct"]),
            "max_abs_error_pct": _verdict(job["max_abs_error_pct"] <= target["max_abs_error_pct"]),
            "memory_diff_bytes": _verdict(not section["cases_with_memory_diff"]),
        }
    return {
        "max_abs_error_pct": _verdict(job["max_abs_error_pct"] <= target["max_abs_error_pct"]),
        "max_error_iqr_pct": _verdict(max(job["error_iqr_pct"].values()) < target["max_error_iqr_pct"]),
    }


def _case_rows(record: dict) -> list[str]:
    job = stats.spread(model_round_errors(record, "job"))
    alone = stats.spread(model_round_errors(record, "alone")) if "alone" in record["models"] else None
    ranks = record["models"]["job"]["ranks"]
    real = [statistics.median(r["real"]["round_medians_ms"]) for r in ranks]
    emulated = [statistics.median(r["emulated"]["round_medians_ms"]) for r in ranks]
    load = record["load"]
    runnable = [run["runnable_median"] for run in load if run["runnable_median"] is not None]
    alone_cells = (
        f"{alone['median']:+.2f} | {alone['iqr']:.2f} | {alone['worst']:+.2f}" if alone else "- | - | -"
    )
    stable = "yes" if record["stable"] else f"NO ({record['real_round_iqr_pct']:.1f} %)"
    return [
        f"| {record['case']} | {'+'.join(map(str, record['real_ranks']))} of {record['layout']['world_size']} "
        f"| {record['rounds']} | {' / '.join(f'{v:.1f}' for v in real)} | {' / '.join(f'{v:.1f}' for v in emulated)} "
        f"| {job['median']:+.2f} | {job['iqr']:.2f} | {job['worst']:+.2f} | {alone_cells} "
        f"| {record['memory_diff_bytes']} | {record['num_processes']['real']} / {record['num_processes']['emulated']} "
        f"| {statistics.median(runnable) if runnable else '-'} | {stable} |"
    ]


def _summary_lines(summary: dict) -> list[str]:
    lines = []
    for key, section in summary.items():
        target = TARGETS[key]
        verdicts = ", ".join(f"{name} {verdict}" for name, verdict in section["verdicts"].items())
        lines.append(f"- {key.replace('_', '-')} (targets {target}): {verdicts}.")
        for model, numbers in section["models"].items():
            if numbers["mean_abs_error_pct"] is None:
                continue
            lines.append(
                f"  - {model} costs: mean |median error| {numbers['mean_abs_error_pct']:.2f} %, "
                f"max {numbers['max_abs_error_pct']:.2f} % over {len(numbers['median_error_pct'])} "
                "stable cases"
            )
        if section["unstable_cases"]:
            lines.append(
                f"  - ground truth unstable, left out of the targets: {', '.join(section['unstable_cases'])}"
            )
        if section["cases_with_memory_diff"]:
            lines.append(f"  - memory differs: {', '.join(section['cases_with_memory_diff'])}")
    return lines


def _calibration_lines(calibration: dict) -> list[str]:
    lines = [
        f"Calibrations: each pattern measured {calibration['repeats']} times (fresh processes), "
        f"{calibration['repetitions']} repetitions per point; the model takes each point's median over "
        "them. Cost in us by message bytes: median [every calibration's median].",
        "",
    ]
    for name, model in calibration["models"].items():
        lines.append(f"- {name} ({model['seconds']:.0f} s):")
        for table, sizes in model["every_draw_us"].items():
            medians = dict(
                model["median_cost_us"].get(table.replace("/n=", "/"), model["median_cost_us"].get(table, []))
            )
            cells = ", ".join(
                f"{size} B {medians.get(int(size), float('nan')):.0f} [{' '.join(f'{v:.0f}' for v in draws)}]"
                for size, draws in sizes.items()
            )
            lines.append(f"  - {table}: {cells}")
    return lines


def markdown(record: dict) -> str:
    env = record["environment"]
    title = "Fidelity on CPU" + (
        "" if record["form"] == "full" else f", {record['form']} form (not a result)"
    )
    lines = [
        f"# {title} ({record['date']})",
        "",
        machine_line(env, EVERY_PACKAGE) + f". The suite took {record['seconds'] / 60:.1f} min "
        f"(expected on a quiet machine: {record['expected_seconds'] / 60:.0f} min).",
        "",
        "Every emulated run is the product's emulation pass over a graph from its capture passes "
        "(`benchmarks/fidelity/passes.py`). Error per round: the emulated rank's median iteration time "
        "against the real run's in the same round (every rank a real process); the table gives the rounds' "
        "median, inter-quartile range (IQR, percentage points) and worst round. Costs: `job`, every group "
        "of a job of the case's size at once (the suite's model); `alone`, one group at a time. Memory: "
        "the rank's peak of live tensor storage (the CPU tracker, the same in both runs). Processes: the "
        "case's own (real run / emulation) and the machine's runnable tasks (median over the runs' "
        "samples, threads included). Stable: the real run's round medians within an IQR of 2 % of their "
        "median.",
        "",
        "| case | real ranks | rounds | real ms | emulated ms | error % median | IQR | worst | alone: median "
        "| IQR | worst | memory diff B | processes | runnable | stable |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case in record["cases"]:
        lines += _case_rows(case)
    for failure in record["failed_cases"]:
        lines.append(
            f"| {failure['case']} | failed: {failure['error'].strip().splitlines()[-1][:120]} |" + " |" * 13
        )
    lines += [
        "",
        "Verdicts (job costs, rounds' medians, stable cases):",
        "",
        *_summary_lines(record["summary"]),
    ]
    by_draw = [(c["case"], c["simulated_ms_by_calibration_draw"]) for c in record["cases"]]
    if any(draws for _, draws in by_draw):
        lines += [
            "",
            "Simulated iteration ms over each calibration draw of the job costs: "
            + "; ".join(f"{name} {' / '.join(f'{v:.1f}' for v in draws)}" for name, draws in by_draw)
            + ".",
        ]
    lines += ["", *_calibration_lines(record["calibration"])]
    return "\n".join(lines) + "\n"
