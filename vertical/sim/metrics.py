"""Scoring a run from its fetch log, exactly (no sampling).

A document page is *fresh* from a fetch until its next change; it is stale
before its first fetch (the index lacks it) and from a missed change to the
next fetch. Its *age* is 0 when fresh, else the time since the first change
the index missed (since its creation, before the first fetch). Time averages
run over ``[warmup, horizon)`` and over the pages that exist at each moment;
hubs are navigation, not documents, and only count in ``wasted``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vertical.sim.engine import FetchLog
from vertical.sim.site import Site

__all__ = ["RunMetrics", "page_freshness", "score"]


@dataclass
class RunMetrics:
    freshness: float  # time-averaged share of fresh pages
    age: float  # time-averaged age, days
    q: float  # log(1 + size)-weighted freshness (S.C.E.N.T.'s Q)
    wasted: float  # share of fetches that found the page unchanged
    changes_captured: float  # share of changes whose version some fetch saw
    discovery_p50: float  # hours from announcement to first fetch
    discovery_p95: float
    discovery_missed: float  # share of announced pages never discovered
    fetches: int  # fetches in the window
    daily_freshness: list[float]  # freshness of each day of the run


def _cumulative(starts: np.ndarray, ends: np.ndarray, weights: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """``sum(w * |[a, b) ∩ [0, g)|)`` for each ``g`` in ``grid`` (``a <= b``)."""

    def part(x: np.ndarray) -> np.ndarray:
        order = np.argsort(x, kind="stable")
        xs, ws = x[order], weights[order]
        cw = np.concatenate([[0.0], np.cumsum(ws)])
        cwx = np.concatenate([[0.0], np.cumsum(ws * xs)])
        k = np.searchsorted(xs, grid, side="left")
        return grid * cw[k] - cwx[k]

    return part(starts) - part(ends)


def _age_integral(base: np.ndarray, start: np.ndarray, end: np.ndarray, lo: float) -> float:
    """``sum(∫ (t - base) dt)`` over ``[max(start, lo), end)`` where not empty."""
    u = np.maximum(start, lo)
    keep = end > u
    b, u, v = base[keep], u[keep], end[keep]
    return float(np.sum(((v - b) ** 2 - (u - b) ** 2) / 2.0))


def _fetch_spans(site: Site, log: FetchLog) -> tuple[np.ndarray, ...]:
    """The fetches in page order: page, time, first fetch of its page or not,
    the page's next fetch (the horizon after its last), its first change
    after the fetch (inf if none), and the indices in ``site.change_times``
    of the first change after the fetch and after the page's previous fetch."""
    H = float(site.horizon)  # an int horizon would make nxt an int array
    owner = np.repeat(np.arange(site.n), np.diff(site.offsets))
    ct = site.change_times
    span = H + 2.0
    ct_key = owner * span + ct

    order = np.lexsort((log.times, log.pages))
    P, T = log.pages[order], log.times[order]
    m = len(P)
    first = np.ones(m, dtype=bool)
    first[1:] = P[1:] != P[:-1]
    last = np.ones(m, dtype=bool)
    last[:-1] = P[1:] != P[:-1]
    nxt = np.full(m, H)
    nxt[:-1] = np.where(last[:-1], H, T[1:])
    prv = np.where(first, site.created[P], np.concatenate([[0.0], T[:-1]]))

    j_after = np.searchsorted(ct_key, P * span + T, side="right")  # first change after T
    j_before = np.searchsorted(ct_key, P * span + prv, side="right")
    has_next = j_after < site.offsets[P + 1]
    # The next change after the fetch (a site where nothing changes has none to index).
    e = np.where(has_next, ct[np.minimum(j_after, len(ct) - 1)], np.inf) if len(ct) else np.full(m, np.inf)
    return P, T, first, nxt, e, j_after, j_before


def page_freshness(site: Site, log: FetchLog, warmup: float) -> tuple[np.ndarray, np.ndarray]:
    """Per page: the days it was fresh in ``[warmup, horizon)``, and its
    fetches there (hubs included; :func:`score`'s freshness is the first
    summed over the documents, over their days alive in the window)."""
    H, W = float(site.horizon), float(warmup)
    P, T, _, nxt, e, _, _ = _fetch_spans(site, log)
    fresh = np.clip(np.minimum(np.minimum(e, nxt), H) - np.maximum(T, W), 0.0, None)
    return (np.bincount(P, weights=fresh, minlength=site.n),
            np.bincount(P[T >= W], minlength=site.n).astype(float))


def score(site: Site, log: FetchLog, warmup: float) -> RunMetrics:
    """Every metric of one run (see the module docstring)."""
    H, W = float(site.horizon), float(warmup)  # an int horizon would make nxt an int array
    n, first_new = site.n, site.first_new
    created = site.created
    owner = np.repeat(np.arange(n), np.diff(site.offsets))
    ct = site.change_times
    P, T, first, nxt, e, j_after, j_before = _fetch_spans(site, log)
    changed = first | (j_after > j_before)

    doc_f = P >= site.n_hubs
    docs = np.arange(site.n_hubs, n)
    w_all = np.log1p(site.size)
    days = np.minimum(np.arange(0.0, np.ceil(H) + 1.0), H)
    grid = np.unique(np.concatenate([days, [W, H]]))

    # Fresh intervals [T, min(e, nxt)); page lives [created, H).
    fa, fb, fp = T[doc_f], np.minimum(e, nxt)[doc_f], P[doc_f]
    fresh_cum = _cumulative(fa, fb, np.ones(len(fa)), grid)
    fresh_cum_w = _cumulative(fa, fb, w_all[fp], grid)
    live_cum = _cumulative(created[docs], np.full(len(docs), H), np.ones(len(docs)), grid)
    live_cum_w = _cumulative(created[docs], np.full(len(docs), H), w_all[docs], grid)
    iW, iH = int(np.searchsorted(grid, W)), len(grid) - 1
    live = live_cum[iH] - live_cum[iW]
    freshness = (fresh_cum[iH] - fresh_cum[iW]) / live
    q = (fresh_cum_w[iH] - fresh_cum_w[iW]) / (live_cum_w[iH] - live_cum_w[iW])
    at_days = np.searchsorted(grid, np.unique(days))
    day_live = np.diff(live_cum[at_days])
    day_fresh = np.diff(fresh_cum[at_days])
    daily = np.where(day_live > 0, day_fresh / np.where(day_live > 0, day_live, 1.0), np.nan)

    # Age: stale after a missed change, and before the first fetch.
    stale = doc_f & (e < nxt)
    age_total = _age_integral(e[stale], e[stale], nxt[stale], W)
    first_fetch = np.full(n, np.inf)
    first_fetch[P[first]] = T[first]
    never_end = np.minimum(first_fetch[docs], H)
    age_total += _age_integral(created[docs], created[docs], never_end, W)
    age = age_total / live

    # Wasted fetches (all pages, hubs included) and captured changes (documents).
    in_window = T >= W
    fetches = int(np.count_nonzero(in_window))
    wasted = float(np.count_nonzero(in_window & ~changed)) / max(fetches, 1)
    seen = np.maximum(j_after - 1, 0)
    captured = doc_f & (j_after > j_before) & (j_after - 1 >= site.offsets[P])
    if len(ct):
        captured &= ct[seen] >= W
    doc_changes = (owner >= site.n_hubs) & (ct >= W)
    changes_captured = float(np.count_nonzero(captured)) / max(int(np.count_nonzero(doc_changes)), 1)

    # Discovery of announced pages created in the window.
    latencies: list[np.ndarray] = []
    missed = 0
    considered = 0
    for h, pages in enumerate(site.hub_pages):
        if len(pages) == 0:
            continue
        born = created[pages]
        drop = np.full(len(pages), np.inf)
        k = site.list_length
        if len(pages) > k:  # pushed off the list by the k-th page announced after it
            drop[:-k] = born[k:]
        hub_fetches = np.sort(log.times[log.pages == h])
        idx = np.searchsorted(hub_fetches, born, side="left")
        seen_on_hub = (idx < len(hub_fetches)) & (hub_fetches[np.minimum(idx, max(len(hub_fetches) - 1, 0))] < drop) \
            if len(hub_fetches) else np.zeros(len(pages), dtype=bool)
        got = first_fetch[pages]
        window = born >= W
        fetched = np.isfinite(got)
        known = seen_on_hub | (got < np.inf)
        lost = window & ~fetched & ~seen_on_hub & (drop < H)
        pending = window & ~fetched & known  # seen, not fetched yet: at least H - born
        latencies.append((got[window & fetched] - born[window & fetched]) * 24.0)
        latencies.append((H - born[pending]) * 24.0)
        missed += int(np.count_nonzero(lost))
        considered += int(np.count_nonzero(window & (fetched | known | lost)))
    # The oracle learns of pages when they are created, without hubs.
    if site.n_hubs and not np.any(log.pages < site.n_hubs) and first_new < n:
        born = created[first_new:]
        got = first_fetch[first_new:]
        window = born >= W
        lat = np.where(np.isfinite(got), got, H) - born
        latencies = [lat[window] * 24.0]
        missed, considered = 0, int(np.count_nonzero(window))
    lat = np.concatenate(latencies) if latencies else np.empty(0)
    p50 = float(np.percentile(lat, 50)) if len(lat) else float("nan")
    p95 = float(np.percentile(lat, 95)) if len(lat) else float("nan")
    return RunMetrics(
        freshness=float(freshness),
        age=float(age),
        q=float(q),
        wasted=wasted,
        changes_captured=changes_captured,
        discovery_p50=p50,
        discovery_p95=p95,
        discovery_missed=missed / considered if considered else 0.0,
        fetches=fetches,
        daily_freshness=[float(x) for x in daily],
    )
