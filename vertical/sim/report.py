"""The markdown table and the PNG plots of a scenario's results."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

__all__ = ["best_scent", "write_plots", "write_table"]


def _fmt(value: Any, spec: str = ".3f", std: Any = None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    text = format(value, spec)
    if std is not None and not (isinstance(std, float) and math.isnan(std)) and std:
        text += f" ± {format(std, spec)}"
    return text


def _label(entry: dict[str, Any]) -> str:
    params = entry.get("params") or {}
    return entry["policy"] + "".join(f" ΔS={v:g}" if k == "delta_s" else f" {k}={v:g}" for k, v in params.items())


def best_scent(entries: list[dict[str, Any]]) -> dict[float, dict[str, Any]]:
    """For each budget, the scent entry with the best freshness."""
    best: dict[float, dict[str, Any]] = {}
    for e in entries:
        if e["policy"] == "scent" and (e["budget"] not in best or e["freshness"] > best[e["budget"]]["freshness"]):
            best[e["budget"]] = e
    return best


def write_table(results: dict[str, Any], path: Path) -> None:
    """One row per policy and budget, the seeds' mean ± standard deviation."""
    unit = results["scenario"]["budget"]
    kind = next(label for key, label in (("fetches_per_page_per_day", "fetches/page/day"),
                                         ("fetches_per_day", "fetches/day"), ("seconds_per_day", "s/day"))
                if key in unit)
    lines = [
        f"| budget ({kind}) | policy | freshness | % of oracle | age (days) | Q | Q % of oracle | wasted | captured | discovery p50 (h) | p95 (h) | never discovered |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for e in results["results"]:
        lines.append(
            "| "
            + " | ".join(
                [
                    f"{e['budget']:g}",
                    _label(e),
                    _fmt(e["freshness"], ".3f", e.get("freshness_std")),
                    _fmt(e["freshness_pct_of_oracle"], ".1f"),
                    _fmt(e["age"], ".2f"),
                    _fmt(e["q"], ".3f"),
                    _fmt(e["q_pct_of_oracle"], ".1f"),
                    _fmt(e["wasted"], ".2f"),
                    _fmt(e["changes_captured"], ".2f"),
                    _fmt(e["discovery_p50"], ".1f"),
                    _fmt(e["discovery_p95"], ".1f"),
                    _fmt(e["discovery_missed"], ".3f"),
                ]
            )
            + " |"
        )
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_plots(results: dict[str, Any], series: list[dict[str, Any]], out: Path) -> None:
    """``freshness_vs_budget.png`` and ``freshness_over_time.png`` (matplotlib, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = results["results"]
    budgets = sorted({e["budget"] for e in entries})
    best = best_scent(entries)
    policies = list(dict.fromkeys(e["policy"] for e in entries))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy in policies:
        if policy == "scent":
            rows = [best[b] for b in budgets if b in best]
            label = "scent (best ΔS)"
        else:
            rows = [e for e in entries if e["policy"] == policy]
            rows.sort(key=lambda e: e["budget"])
            label = policy
        ax.errorbar(
            [e["budget"] for e in rows],
            [e["freshness"] for e in rows],
            yerr=[e.get("freshness_std") or 0.0 for e in rows],
            marker="o",
            capsize=3,
            label=label,
            linestyle="--" if policy.startswith("oracle") else "-",
        )
    ax.set_xscale("log")
    ax.set_xlabel("budget (" + results["units"]["budget"].replace("_", " ") + ")")
    ax.set_ylabel("time-averaged freshness (after warm-up)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "freshness_vs_budget.png", dpi=120)
    plt.close(fig)

    warmup = results["scenario"]["warmup_days"]
    fig, axes = plt.subplots(1, len(budgets), figsize=(5 * len(budgets), 4), sharey=True, squeeze=False)
    for ax, budget in zip(axes[0], budgets):
        for s in series:
            if s["budget"] != budget:
                continue
            if s["policy"] == "scent" and (budget not in best or s.get("params") != best[budget].get("params")):
                continue
            label = "scent (best ΔS)" if s["policy"] == "scent" else s["policy"]
            ax.plot(range(len(s["daily_freshness"])), s["daily_freshness"], label=label, linewidth=1)
        ax.axvspan(0, warmup, color="grey", alpha=0.15, label="warm-up")
        ax.set_title(f"budget {budget:g}")
        ax.set_xlabel("day")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("freshness (daily mean over seeds)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "freshness_over_time.png", dpi=110)
    plt.close(fig)
