"""What no schedule can reach without a change signal (benchmarks/FRESHNESS.md,
"What a schedule can reach without a change signal").

    python benchmarks/freshness/bound.py SCENARIO BUDGET SEED [--step HOURS] [--bins N] [--checks] [--mix] [-v]

A schedule that sees only whether a page changed between two fetches learns
nothing of the page from its first fetch and one bit from its second. This
bounds what any such schedule can reach in the family's window, granting it
more than it has:

* the site's true distribution of rates from day 0;
* each page's exact rate from its third fetch on (before that, what the
  second fetch's bit tells, by Bayes' rule);
* each day's budget as one total for the day, with one fetch carried over
  (the simulator spends it tick by tick and loses what is idle);
* fetch times in cells of ``--step`` hours, each cell credited fresh from
  its start when the page is fetched in it, and the page's freshness after
  a fetch decaying from the end of the cell (a fetch at any time in the cell
  is credited at least what it earns).

Under these the best mix of per-page policies is a linear programme over
policies, solved by column generation (Dantzig-Wolfe): the programme mixes
the policies found so far under each day's capacity; its dual prices each
day's fetches; the best policy of a page at those prices, found by dynamic
programming, joins the mix and gives the bound by weak duality (the best
value of a page at the prices, plus the price of the budget).

The rates are rounded to bins, ``--bins`` a decade (``BINS_PER_DECADE``),
down to each bin's lower edge: freshness falls with the rate, so this
rounds the value up. Bayes' rule runs on the binned rates and on the
spacing of the two fetches' cells: the bound's one approximation, at the
bins' and the cells' width (finer bins and cells lowered the bound in
every cell tried: see FRESHNESS.md).

Prints the simulated uniform and oracle freshness for the seed, the bound
(with the best mix found: the bound can fall no lower than that), and the
share of the uniform -> oracle gap each allows; with ``--checks``, as checks
of the method, the same with every rate known from day 0 (at least the
oracle), and with no rate ever known (at least round robin: how far above
it is what the rounding costs). With ``--mix``, how the best mix found
times each page's first three fetches, by the day of its first (see
:func:`describe_mix`).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Callable

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from vertical.sim.engine import policy_specs  # noqa: E402
from vertical.sim.runner import _job, _site  # noqa: E402
from vertical.sim.scenario import load_scenario  # noqa: E402

#: Rate bins a decade, by default.
BINS_PER_DECADE = 20
#: Rates above this (a day) share one bin, at this rate: rounding down
#: credits such a page at most 6 hours of freshness a fetch.
FAST = 4.0
#: Weight of the best bound's prices in the next round's (Wentges' smoothing).
SMOOTHING = 0.7
INFOS = ("bits", "full", "none")


def rate_bins(rates: np.ndarray, per_decade: int = BINS_PER_DECADE) -> tuple[np.ndarray, np.ndarray]:
    """Lower edges and shares of the rates' bins, ``per_decade`` a decade (0
    for the static pages; ``FAST`` for the pages changing more often)."""
    n = len(rates)
    moving = np.minimum(rates[rates > 0], FAST)
    edges, shares = [], []
    if len(moving) < n:
        edges.append(0.0)
        shares.append((n - len(moving)) / n)
    if len(moving):
        k = np.floor(np.log10(moving) * per_decade).astype(int)
        for b, count in zip(*np.unique(k, return_counts=True)):
            edges.append(10.0 ** (b / per_decade))
            shares.append(count / n)
    return np.array(edges), np.array(shares)


class Grid:
    """The page's credit on the time grid, for each rate bin: ``seg[b, i, j]``
    the fresh days in the window between a fetch in cell ``i`` and the next
    in cell ``j`` (``j == cells``: none before the horizon); ``mean[i, j]``
    the same over the bins' ``share`` of the pages."""

    def __init__(self, lam: np.ndarray, share: np.ndarray, step: float, warmup: float, horizon: float) -> None:
        self.lam, self.share, self.step = lam, share, step
        self.cells = cells = int(round(horizon / step))
        start = np.arange(cells + 1) * step  # start[cells] is the horizon
        start[cells] = horizon
        a, e = start[:cells, None], start[None, :]  # fetch cell, next fetch's cell
        lo = np.maximum(a, warmup)
        flat = np.clip(np.minimum(e, a + step) - lo, 0.0, None)  # the fetch's own cell
        s = np.maximum(lo, a + step)
        span = np.clip(e - s, 0.0, None)[None]
        lam3 = lam[:, None, None]
        with np.errstate(invalid="ignore", divide="ignore"):
            decay = np.where(lam3 > 0, np.exp(-lam3 * (s - a - step)[None]) * -np.expm1(-lam3 * span)
                             / np.where(lam3 > 0, lam3, 1.0), span)
        seg = flat[None] + decay
        seg[:, np.arange(cells)[:, None] >= np.arange(cells + 1)[None, :]] = 0.0  # j <= i: no segment
        self.seg = seg
        self.mean = np.tensordot(share, seg, axes=1)

    def continuation(self, price: np.ndarray, seg: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``G[b, i]``: the most a page of bin ``b`` fetched in cell ``i`` can
        still earn, less the prices of its further fetches; ``nxt[b, i]`` the
        cell of its next fetch (``cells``: none). With ``seg``, for its rows
        instead of the bins'."""
        cells = self.cells
        seg = self.seg if seg is None else seg
        rows = len(seg)
        G = np.empty((rows, cells + 1))
        G[:, cells] = 0.0
        nxt = np.full((rows, cells), cells)
        priced = np.append(price, 0.0)
        for i in range(cells - 1, -1, -1):
            more = seg[:, i, i + 1:] - priced[i + 1:] + G[:, i + 1:]
            j = more.argmax(axis=1)
            G[:, i] = more[np.arange(rows), j]
            nxt[:, i] = i + 1 + j
        return G, nxt

    def downstream(self, nxt: np.ndarray) -> np.ndarray:
        """``C[b, i]``: the fetches per cell after one in cell ``i`` of a page
        of bin ``b`` following ``nxt``."""
        bins, cells = nxt.shape
        C = np.zeros((bins, cells + 1, cells))
        rows = np.arange(bins)
        for i in range(cells - 1, -1, -1):
            j = nxt[:, i]
            more = j < cells
            C[more, i] = C[rows[more], j[more]]
            C[rows[more], i, j[more]] += 1.0
        return C[:, :cells]


#: A page's first three fetch cells under a ``bits`` policy: the first, the
#: second, and the third after a changed and after an unchanged second (-1:
#: none). Nothing (``None``) for the other kinds of policy.
Plan = tuple[int, int, int, int] | None


def price_out(info: str, grid: Grid, price: np.ndarray) -> list[tuple[int, float, np.ndarray, Plan]]:
    """The best policies of a page at these prices under ``info``: ``bits``
    (two fetches timed blind; the second's bit, changed or not, times the
    third; the rate known from then on), ``full`` (the rate known from day 0:
    one group a bin) or ``none`` (never known). Returns ``(group, reduced
    value, fetches per cell, plan)``, in expectation over the group's pages,
    the reduced value being the fresh days less the prices paid: the best
    policy of each first cell (the programme takes many at once)."""
    cells, lam, share = grid.cells, grid.lam, grid.share
    priced = np.append(price, 0.0)
    out = []
    if info == "full":
        G, nxt = grid.continuation(price)
        downstream = grid.downstream(nxt)
        for b in range(len(lam)):
            count = np.zeros(cells)
            i = int((G[b, :cells] - price).argmax())
            value = float(G[b, i] - price[i])
            if value > 0:
                count[i] = 1.0
                count += downstream[b, i]
            out.append((b, max(value, 0.0), count, None))
        return out
    if info == "none":  # one schedule for every page: the pages' mean credit
        G, nxt = grid.continuation(price, grid.mean[None])
        downstream = grid.downstream(nxt)
        for i in range(cells):
            count = downstream[0, i].copy()
            count[i] += 1.0
            out.append((0, float(G[0, i] - price[i]), count, None))
        return out
    # bits
    G, nxt = grid.continuation(price)
    mean_seg = grid.mean
    step = grid.step
    best = np.full(cells, -np.inf)  # per first cell: the best value, its second fetch and thirds
    second = np.full(cells, -1)
    thirds = np.full((2, cells), cells)
    for i2 in range(1, cells):
        d = i2 - np.arange(i2)  # cells between the first fetch (i1 = i2 - d) and the second
        same = np.exp(-np.outer(d * step, lam))  # P(no change | bin) over the interval, (i1, bin)
        # After the bit, either no third fetch or one in cell j > i2, then the rate is known.
        after = grid.seg[:, i2, i2 + 1:] + G[:, i2 + 1:]  # (bin, j), j in i2+1..cells
        total = mean_seg[:i2, i2] - price[:i2] - price[i2]
        pick = []
        for joint in (share * (1.0 - same), share * same):  # changed, unchanged
            value = joint @ after - np.outer(joint.sum(axis=1), priced[i2 + 1:])
            j = value.argmax(axis=1)
            total = total + value[np.arange(i2), j]
            pick.append(i2 + 1 + j)
        better = np.flatnonzero(total > best[:i2])
        best[better], second[better] = total[better], i2
        thirds[0, better], thirds[1, better] = pick[0][better], pick[1][better]
    downstream = grid.downstream(nxt)
    for i1 in range(cells):
        single = mean_seg[i1, cells] - price[i1]
        count = np.zeros(cells)
        count[i1] = 1.0
        if second[i1] < 0 or single >= best[i1]:
            out.append((0, float(single), count, (i1, -1, -1, -1)))
            continue
        i2 = second[i1]
        count[i2] += 1.0
        same = np.exp(-(i2 - i1) * step * lam)
        for i3, joint in zip(thirds[:, i1], (share * (1.0 - same), share * same)):
            if i3 < cells:
                count[i3] += joint.sum()
                count += joint @ downstream[:, i3]
        plan = (i1, int(i2), *(int(i3) if i3 < cells else -1 for i3 in thirds[:, i1]))
        out.append((0, float(best[i1]), count, plan))
    return out


def bound(info: str, rates: np.ndarray, created: np.ndarray, capacity: np.ndarray, step: float, warmup: float,
          horizon: float, *, bins: int = BINS_PER_DECADE, rounds: int = 300, tol: float = 2e-4,
          say: Callable[[str], None] | None = None) -> tuple[float, float, list[tuple[float, Plan]]]:
    """The least upper bound found on the window's mean freshness under
    ``info``, the best mix of policies found (the bound can fall no lower)
    and that mix, as ``(share of the pages, plan)`` per policy in it, for
    pages of ``rates`` created at ``created`` (days) when day ``d``'s
    fetches are at most ``capacity[d]``, rates in ``bins`` bins a decade."""
    from scipy.optimize import linprog

    n = len(rates)
    lam, share = rate_bins(rates, bins)
    grid = Grid(lam, share, step, warmup, horizon)
    cells = grid.cells
    days = len(capacity)
    day_of = np.minimum((np.arange(cells) * step).astype(int), days - 1)
    per_cell_day = np.zeros((days, cells))
    per_cell_day[day_of, np.arange(cells)] = 1.0
    live = float(np.sum(horizon - np.maximum(created, warmup))) / n  # days a page, in the window
    if info == "full":
        if np.any(created > 0):
            raise ValueError("rates known from day 0: for sites without announced pages")
        birth, weight = np.zeros(len(lam), dtype=int), share
    else:  # a page is fetched from the cell it is created in
        birth, counts = np.unique(np.minimum((created / step).astype(int), cells - 1), return_counts=True)
        weight = counts / n
    groups = len(weight)
    columns = [(g, 0.0, np.zeros(days)) for g in range(groups)]  # fetching nothing is always feasible
    plans: list[Plan] = [None] * groups
    best_upper, lower, stalled = math.inf, 0.0, False
    mu_best = mu_lp = np.zeros(days)

    def price_round(mu: np.ndarray) -> float:
        price = mu[day_of]
        found = price_out(info, grid, price)
        if info == "full":
            by_group = [[f] for f in found]
        else:  # found[i]: the best policy whose first fetch is in cell i
            by_group = [found[b:] for b in birth]
        top = np.zeros(groups)
        for g, options in enumerate(by_group):
            if g or info == "full":  # a few for each later group; every first cell for the first
                options = sorted(options, key=lambda f: f[1], reverse=True)[:3]
            for _, reduced, count, plan in options:
                top[g] = max(top[g], reduced)
                columns.append((g, reduced + float(price @ count), per_cell_day @ count))
                plans.append(plan)
        return float(weight @ top) + float(mu @ capacity)

    # A start: flat prices over a wide range, the best of them kept.
    for flat in np.geomspace(0.5, horizon - warmup, 10):
        mu = np.full(days, flat)
        upper = price_round(mu)
        if upper < best_upper:
            best_upper, mu_best = upper, mu
    for r in range(rounds):
        A = np.array([c[2] for c in columns]).T
        eq = np.zeros((groups, len(columns)))
        eq[[c[0] for c in columns], np.arange(len(columns))] = 1.0
        res = linprog(-np.array([c[1] for c in columns]), A_ub=A, b_ub=capacity, A_eq=eq, b_eq=weight,
                      bounds=(0, None), method="highs")
        stalled = -res.fun <= lower + 1e-9
        lower = -res.fun
        mu_lp = np.maximum(-res.ineqlin.marginals, 0.0)
        if say:
            say(f"  {info} round {r}: bound {best_upper / live:.4f}, mix {lower / live:.4f}, "
                f"{len(columns)} policies")
        if best_upper - lower <= tol * live:
            break
        # Wentges' smoothing: the programme's duals alone swing from one
        # extreme to another; when the smoothed prices found nothing new, its own.
        mu = mu_lp if stalled else SMOOTHING * mu_best + (1.0 - SMOOTHING) * mu_lp
        upper = price_round(mu)
        if upper < best_upper:
            best_upper, mu_best = upper, mu
    mix = [(float(x), plan) for x, plan in zip(res.x, plans) if x > 1e-9]
    return best_upper / live, lower / live, mix


def describe_mix(mix: list[tuple[float, Plan]], rates: np.ndarray, step: float, bins: int,
                 slice_days: float = 10.0) -> list[str]:
    """Rows of a table of how a ``bits`` mix times each page's first three
    fetches, by the day of its first in slices of ``slice_days``: the share
    of the site's pages first fetched then; the share of them fetched a
    second time, and after how many days (mean); of those found changed by
    the second (by the site's rates), the share fetched a third time and
    after how many days; the same for those found unchanged."""
    lam, share = rate_bins(rates, bins)
    # Per slice: pages, second fetches, days to them, and for changed and
    # unchanged second fetches: pages, third fetches, days to them.
    rows: dict[int, np.ndarray] = {}
    for x, plan in mix:
        if plan is None:
            continue
        i1, i2, *thirds = plan
        row = rows.setdefault(int(i1 * step // slice_days), np.zeros(9))
        row[0] += x
        if i2 < 0:
            continue
        gap = (i2 - i1) * step
        p_changed = float(share @ -np.expm1(-lam * gap))
        row[1:3] += x, x * gap
        for at, third, p in ((3, thirds[0], p_changed), (6, thirds[1], 1.0 - p_changed)):
            row[at] += x * p
            if third >= 0:
                row[at + 1: at + 3] += x * p, x * p * (third - i2) * step

    def share_after(count: float, of: float, days: float) -> str:
        return f"{count / of:.0%} after {days / count:.0f} d" if count > 1e-9 else "none"

    lines = []
    for k in sorted(rows):
        n, second, days2, changed, third_c, days_c, unchanged, third_u, days_u = rows[k]
        lines.append(f"| {k * slice_days:g}–{(k + 1) * slice_days:g} | {n:.1%} | {share_after(second, n, days2)} | "
                     f"{share_after(third_c, changed, days_c) if changed > 1e-9 else '–'} | "
                     f"{share_after(third_u, unchanged, days_u) if unchanged > 1e-9 else '–'} |")
    return lines


def main(argv: list[str]) -> None:
    options = {"--step": 6.0, "--bins": BINS_PER_DECADE}
    for flag, default in options.items():
        if flag in argv:
            at = argv.index(flag)
            options[flag] = type(default)(argv[at + 1])
            argv = argv[:at] + argv[at + 2:]
    step_hours, bins = options["--step"], options["--bins"]
    verbose, checks, show_mix = "-v" in argv, "--checks" in argv, "--mix" in argv
    argv = [a for a in argv if a not in ("-v", "--checks", "--mix")]
    say = (lambda msg: print(msg, file=sys.stderr, flush=True)) if verbose else None
    name, budget, seed = argv[0], float(argv[1]), int(argv[2])
    scn = load_scenario(HERE / "family" / f"{name}.yaml")
    if scn.budget_kind != "fetches_per_page_per_day":
        sys.exit("the bound is for a budget in fetches per page per day")
    site = _site(scn, seed)
    docs = slice(site.n_hubs, site.n)
    rates, created = site.rate[docs], site.created[docs]
    sim = {label: _job(scn, seed, next(s for s in policy_specs(scn) if s.label == label), budget)["freshness"]
           for label in ("uniform", "oracle")}
    # Each day's budget: as the simulator gives it (the pages known by the end
    # of the day, with one fetch's token carried over), the hubs' fetches not
    # taken from it; per page of the site.
    days = int(math.ceil(scn.horizon_days))
    alive = np.searchsorted(np.sort(created), np.arange(1, days + 1), side="right")
    capacity = (budget * alive + 1.0) / len(rates)
    gap = sim["oracle"] - sim["uniform"]

    def closed(x: float) -> str:
        return f"{100.0 * (x - sim['uniform']) / gap:.0f}%"

    print(f"{name} at {budget:g}, seed {seed}: {len(rates)} pages, cells of {step_hours:g} h, "
          f"{bins} rate bins a decade")
    print(f"  simulated: uniform {sim['uniform']:.4f}, oracle {sim['oracle']:.4f}")
    titles = {"bits": "changed/unchanged bits", "full": "rates known from day 0", "none": "rates never known"}
    step = step_hours / 24.0
    for info in INFOS if checks else INFOS[:1]:
        if info == "full" and np.any(created > 0):
            continue
        upper, best, mix = bound(info, rates, created, capacity, step, scn.warmup_days, scn.horizon_days,
                                 bins=bins, say=say)
        print(f"  {titles[info]}: at most {upper:.4f} ({closed(upper)} of the gap); "
              f"best mix {best:.4f} ({closed(best)})", flush=True)
        if show_mix and info == "bits":
            print("\n| first fetch, day | pages | second fetch | third, second changed | third, second unchanged |")
            print("|---|---:|---|---|---|")
            print("\n".join(describe_mix(mix, rates, step, bins)))


if __name__ == "__main__":
    main(sys.argv[1:])
