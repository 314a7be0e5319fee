"""The simulator's scenario file (YAML), validated into a :class:`Scenario`.

Keys (see DESIGN.md, "Measuring"); all but ``pages`` have defaults::

    pages: 10000
    static_share: 0.4                # pages that never change
    change_interval: {dist: lognormal, median_days: 7, sigma: 2.0}   # a page's mean time between changes
    # change_interval: {dist: weibull, shape: 0.8, scale_days: 10}
    # change_interval: {dist: pareto, min_days: 0.5, alpha: 1.2}
    lastmod: {share: 0.5, lag_days: 0, bogus_share: 0}  # pages sending Last-Modified (see below)
    hosts: [{share: 0.6, delay_s: 180}, {share: 0.4, delay_s: 10}]   # one site, several hosts (see below)
    sections: {count: 20, strength: 0.8}   # URL sections whose pages change alike (see below)
    changefreq: {share: 1.0, noise: 0.3}   # pages a sitemap gives a <changefreq> (see below)
    sizes: {dist: pareto, min_bytes: 2000, alpha: 1.5}
    hubs: {count: 5, list_length: 20, new_pages_per_day: 50}        # 0 new pages: a closed site
    budget: {fetches_per_page_per_day: [0.05, 0.2, 1.0]}           # or {seconds_per_day: [..], cost: {a: .., b: ..}}
    # or {fetches_per_day: [500, 2000]}: the site's, as refetch.budget gives it, however many pages
    horizon_days: 180
    warmup_days: 30
    seeds: [1, 2, 3, 4, 5]
    policies: [uniform, adaptive, nutch, scent, level, optimal, oracle]
    # any SCHEDULE+PRIORITY pair of vertical.policies also works, e.g. optimal+level,
    # and so does a mapping {label: .., schedule: .., priority: .., schedule_params: {..}}
    # simulator settings
    refetch: {initial: 1d, min: 1h, max: 30d, factor: 2, ahead: 1d}   # the simulated site's config,
    # read as a site config's; budget: 5000/d here is budget: {fetches_per_day: [5000]}
    scent_delta_s: [1e-5, 1e-4, 1e-3]                     # the DeltaS sweep (per fetch)
    tick_minutes: 15                                      # one scheduler batch; must divide the horizon

Numbers must be finite, counts (``pages``, ``hubs.count``, ...) whole, and
``change_interval`` takes the keys of its ``dist`` only. A change interval
with no finite mean rate (Weibull of shape 1 or less, Pareto of a tiny
``alpha``) may draw a site of more changes than :data:`~vertical.sim.site.MAX_CHANGES`
for some seeds: that seed stops with an error. With ``seconds_per_day``
the oracle prices every fetch at the mean cost, not its page's: an
upper reference, not the optimum under that budget.

``lastmod``: a share of the documents answer with a ``Last-Modified``
header: the time of their last change, or (``lag_days``) that time cut to a
multiple of ``lag_days`` (1: a date without its hour), or for
``bogus_share`` of them the time of the request (a page rendered on every
request), or with ``build_hours`` the time of the site's last build (builds
at 03:00 and every ``build_hours`` after, which date every page whether it
changed or not). The others send none.
With ``sitemap_hours`` the same pages are listed in a sitemap with that
lastmod, read every so many hours (a fetch not counted against the budget).
With ``header: false`` the pages send no header and only the sitemap dates
them (a sitemap of ``lastmod = now`` with ``bogus_share: 1``, as sitemaps
generated on request often are, then has nothing to be checked against but
the pages' content).

``hosts``: the site's pages spread over hosts (``share`` of the documents
each; the hubs are on the first), each fetched at most ``86400 / delay_s``
times a day (its politeness), whatever the budget: a rate, granted a tick
at a time, not the spacing of the fetches within a tick (which the crawler
keeps with Scrapy's download delay). Without it, one host with no limit but
the budget.

``sections``: the documents' URLs carry a section (``http://sim/<section>/<n>``,
``count`` sections of about equal size), and pages of one section change
alike, as real sites' do (Cho and Garcia-Molina found rates clustered by
site and section). ``strength`` in [0, 1] is the share of the variance of a
page's (normal score of its) change interval, and of its leaning to be
static, that its section explains: a Gaussian copula, so every page's
change interval keeps the ``change_interval`` distribution and the site
keeps its ``static_share`` whatever the strength; 0 is a URL that says
nothing, 1 a section whose pages all change at one rate (or are all
static). Each section thus has its own median rate and static share.
Without it (``count: 0``) the URLs are ``sim:<n>`` and the site is drawn
as before.

``changefreq``: a ``share`` of the documents are listed in a sitemap with a
``<changefreq>``, the value nearest their mean change interval on a log
scale (``hourly`` to ``yearly``; ``never`` for a static page), or for a
``noise`` share of them any of the seven values at random. The schedule
learns it when the page is discovered, as the crawler does from the
sitemap that lists it. The rest of the site is drawn as without it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vertical.config import ConfigError, RefetchConfig, load_yaml, parse_refetch

__all__ = ["POLICIES", "Scenario", "ScenarioError", "load_scenario", "parse_scenario"]

#: Policies the simulator knows (``oracle`` also runs its size-weighted twin for Q).
POLICIES = ("uniform", "adaptive", "nutch", "scent", "level", "optimal", "oracle")


class ScenarioError(ValueError):
    """A bad scenario: the message names the key and what is wrong."""


@dataclass(frozen=True)
class Scenario:
    pages: int
    static_share: float = 0.4
    change_interval: Mapping[str, Any] = field(
        default_factory=lambda: {"dist": "lognormal", "median_days": 7.0, "sigma": 2.0}
    )
    sizes: Mapping[str, Any] = field(default_factory=lambda: {"dist": "pareto", "min_bytes": 2000.0, "alpha": 1.5})
    hubs: int = 5
    list_length: int = 20
    new_pages_per_day: float = 50.0
    budget_kind: str = "fetches_per_page_per_day"  # or "seconds_per_day", "fetches_per_day"
    budgets: tuple[float, ...] = (0.05, 0.2, 1.0)
    cost_a: float = 0.0  # seconds per byte
    cost_b: float = 1.0  # seconds per fetch
    horizon_days: float = 180.0
    warmup_days: float = 30.0
    seeds: tuple[int, ...] = (1, 2, 3, 4, 5)
    policies: tuple[str, ...] = POLICIES
    refetch: Mapping[str, float] = field(
        default_factory=lambda: {"initial": RefetchConfig.initial, "min": RefetchConfig.min,
                                 "max": RefetchConfig.max, "factor": RefetchConfig.factor,
                                 "ahead": RefetchConfig.ahead}  # the crawler's defaults
    )
    scent_delta_s: tuple[float, ...] = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3)
    tick_minutes: float = 15.0
    lastmod: Mapping[str, float] = field(
        default_factory=lambda: {"share": 0.0, "lag_days": 0.0, "bogus_share": 0.0, "build_hours": 0.0,
                                 "sitemap_hours": 0.0, "header": 1.0}
    )
    #: ``(share, delay_s)`` per host; empty: one host, no politeness limit.
    hosts_politeness: tuple[tuple[float, float], ...] = ()
    #: URL sections: ``count`` (0: none) and ``strength`` of the section -> rate link.
    sections: Mapping[str, float] = field(default_factory=lambda: {"count": 0, "strength": 0.0})
    #: Pages with a sitemap ``<changefreq>``: ``share`` of the documents, ``noise`` of them at random.
    changefreq: Mapping[str, float] = field(default_factory=lambda: {"share": 0.0, "noise": 0.0})
    #: Policies given as mappings: label -> {schedule, priority, schedule_params, priority_params}.
    custom_policies: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The scenario as written back to ``results.json``."""
        budget: dict[str, Any] = {self.budget_kind: list(self.budgets)}
        if self.budget_kind == "seconds_per_day":
            budget["cost"] = {"a": self.cost_a, "b": self.cost_b}
        return {
            "pages": self.pages,
            "static_share": self.static_share,
            "change_interval": dict(self.change_interval),
            "sizes": dict(self.sizes),
            "hubs": {"count": self.hubs, "list_length": self.list_length, "new_pages_per_day": self.new_pages_per_day},
            "budget": budget,
            "horizon_days": self.horizon_days,
            "warmup_days": self.warmup_days,
            "seeds": list(self.seeds),
            "policies": list(self.policies),
            "refetch": dict(self.refetch),
            "scent_delta_s": list(self.scent_delta_s),
            "tick_minutes": self.tick_minutes,
            "lastmod": dict(self.lastmod),
            "hosts": [{"share": a, "delay_s": b} for a, b in self.hosts_politeness],
            "sections": dict(self.sections),
            "changefreq": dict(self.changefreq),
            "custom_policies": {k: dict(v) for k, v in self.custom_policies.items()},
        }


_KEYS = {
    "pages", "static_share", "change_interval", "sizes", "hubs", "budget", "horizon_days", "warmup_days",
    "seeds", "policies", "refetch", "scent_delta_s", "tick_minutes", "lastmod", "hosts", "sections",
    "changefreq",
}


#: Each distribution of ``change_interval`` and its own keys.
_DISTRIBUTIONS = {"lognormal": ("median_days", "sigma"), "weibull": ("shape", "scale_days"),
                  "pareto": ("min_days", "alpha")}
_ALL_DISTRIBUTION_KEYS = {key for keys in _DISTRIBUTIONS.values() for key in keys}


def _number(value: Any, key: str, *, low: float | None = None, high: float | None = None) -> float:
    if isinstance(value, str):  # YAML 1.1 reads 1e-4 (no dot) as a string
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            value = float(value)
        except OverflowError:  # a YAML integer of hundreds of digits
            raise ScenarioError(f"{key}: a number of {len(str(abs(value)))} digits is too large") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ScenarioError(f"{key}: expected a number, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ScenarioError(f"{key}: {value!r} is outside [{low}, {high}]")
    return float(value)


def _whole(value: Any, key: str, *, low: int) -> int:
    """A count: a number with nothing after the point (2.9 pages is no count)."""
    number = _number(value, key, low=low)
    if not number.is_integer():
        raise ScenarioError(f"{key}: expected a whole number, got {value!r}")
    return int(number)


def _mapping(value: Any, key: str, known: set[str]) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ScenarioError(f"{key}: expected a mapping, got {value!r}")
    unknown = set(value) - known
    if unknown:
        raise ScenarioError(f"{key}: unknown key(s) {', '.join(sorted(map(str, unknown)))} (known: {', '.join(sorted(known))})")
    return dict(value)


def _numbers(value: Any, key: str, *, low: float = 0.0) -> tuple[float, ...]:
    values = value if isinstance(value, list) else [value]
    if not values:
        raise ScenarioError(f"{key}: needs at least one value")
    return tuple(_number(v, f"{key}[{i}]", low=low) for i, v in enumerate(values))


def _known_policy(name: Any) -> bool:
    if not isinstance(name, str):
        return False
    if name in POLICIES:
        return True
    from vertical.policies import PRIORITIES, SCHEDULES

    schedule, plus, priority = name.partition("+")
    return bool(plus) and schedule in SCHEDULES and priority in PRIORITIES


def parse_scenario(data: Mapping[str, Any]) -> Scenario:
    """Validate a scenario mapping (as read from YAML)."""
    data = _mapping(data, "scenario", _KEYS)
    if "pages" not in data:
        raise ScenarioError("pages: missing")
    d = Scenario(pages=1)
    kw: dict[str, Any] = {"pages": _whole(data["pages"], "pages", low=1)}
    if "static_share" in data:
        kw["static_share"] = _number(data["static_share"], "static_share", low=0, high=1)
    if "change_interval" in data:
        dist = _mapping(data["change_interval"], "change_interval", {"dist", *_ALL_DISTRIBUTION_KEYS}).get("dist")
        if dist not in _DISTRIBUTIONS:
            raise ScenarioError(f"change_interval.dist: expected lognormal, weibull or pareto, got {dist!r}")
        ci = _mapping(data["change_interval"], "change_interval", {"dist", *_DISTRIBUTIONS[dist]})
        if dist == "lognormal":
            ci = {"dist": dist, "median_days": _number(ci.get("median_days"), "change_interval.median_days", low=1e-9),
                  "sigma": _number(ci.get("sigma", d.change_interval["sigma"]), "change_interval.sigma", low=0)}
        elif dist == "weibull":
            ci = {"dist": dist, "shape": _number(ci.get("shape"), "change_interval.shape", low=1e-9),
                  "scale_days": _number(ci.get("scale_days"), "change_interval.scale_days", low=1e-9)}
        else:
            ci = {"dist": dist, "min_days": _number(ci.get("min_days"), "change_interval.min_days", low=1e-9),
                  "alpha": _number(ci.get("alpha"), "change_interval.alpha", low=1e-9)}
        kw["change_interval"] = ci
    if "sizes" in data:
        s = _mapping(data["sizes"], "sizes", {"dist", "min_bytes", "alpha"})
        if s.get("dist", "pareto") != "pareto":
            raise ScenarioError(f"sizes.dist: only pareto is supported, got {s.get('dist')!r}")
        kw["sizes"] = {"dist": "pareto", "min_bytes": _number(s.get("min_bytes", 2000), "sizes.min_bytes", low=1),
                       "alpha": _number(s.get("alpha", 1.5), "sizes.alpha", low=1e-9)}
    if "hubs" in data:
        h = _mapping(data["hubs"], "hubs", {"count", "list_length", "new_pages_per_day"})
        kw["hubs"] = _whole(h.get("count", d.hubs), "hubs.count", low=0)
        kw["list_length"] = _whole(h.get("list_length", d.list_length), "hubs.list_length", low=1)
        kw["new_pages_per_day"] = _number(h.get("new_pages_per_day", d.new_pages_per_day), "hubs.new_pages_per_day", low=0)
        if kw["new_pages_per_day"] > 0 and kw["hubs"] == 0:
            raise ScenarioError("hubs.count: new pages need at least one hub to announce them")
    if "budget" in data:
        kinds = ("fetches_per_page_per_day", "seconds_per_day", "fetches_per_day")
        b = _mapping(data["budget"], "budget", {*kinds, "cost"})
        if sum(kind in b for kind in kinds) != 1:
            raise ScenarioError("budget: give either fetches_per_page_per_day, seconds_per_day or fetches_per_day")
        if "fetches_per_day" in b:
            if "cost" in b:
                raise ScenarioError("budget.cost: only with seconds_per_day")
            kw["budget_kind"] = "fetches_per_day"
            kw["budgets"] = _numbers(b["fetches_per_day"], "budget.fetches_per_day", low=1e-12)
        elif "fetches_per_page_per_day" in b:
            if "cost" in b:
                raise ScenarioError("budget.cost: only with seconds_per_day")
            kw["budgets"] = _numbers(b["fetches_per_page_per_day"], "budget.fetches_per_page_per_day", low=1e-12)
        else:
            kw["budget_kind"] = "seconds_per_day"
            kw["budgets"] = _numbers(b["seconds_per_day"], "budget.seconds_per_day", low=1e-12)
            c = _mapping(b.get("cost", {}), "budget.cost", {"a", "b"})
            kw["cost_a"] = _number(c.get("a", 0.0), "budget.cost.a", low=0)
            kw["cost_b"] = _number(c.get("b", 1.0), "budget.cost.b", low=0)
            if kw["cost_a"] == kw["cost_b"] == 0:
                raise ScenarioError("budget.cost: a fetch must cost something (a or b > 0)")
    if "horizon_days" in data:
        kw["horizon_days"] = _number(data["horizon_days"], "horizon_days", low=1e-3)
    if "warmup_days" in data:
        kw["warmup_days"] = _number(data["warmup_days"], "warmup_days", low=0)
    if kw.get("warmup_days", d.warmup_days) >= kw.get("horizon_days", d.horizon_days):
        raise ScenarioError("warmup_days: must be shorter than horizon_days")
    if "seeds" in data:
        seeds = data["seeds"] if isinstance(data["seeds"], list) else [data["seeds"]]
        if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds):
            raise ScenarioError(f"seeds: expected a list of integers from 0, got {data['seeds']!r}")
        kw["seeds"] = tuple(seeds)
    if "policies" in data:
        pols = list(data["policies"]) if isinstance(data["policies"], list) else [data["policies"]]
        custom: dict[str, dict[str, Any]] = {}
        for i, p in enumerate(pols):
            if isinstance(p, Mapping):
                m = _mapping(p, f"policies[{i}]", {"label", "schedule", "priority", "schedule_params", "priority_params"})
                if not isinstance(m.get("label"), str) or not _known_policy(f"{m.get('schedule')}+{m.get('priority')}"):
                    raise ScenarioError(f"policies[{i}]: needs a label and a known schedule and priority")
                for params in ("schedule_params", "priority_params"):
                    if not isinstance(m.get(params, {}), Mapping):
                        raise ScenarioError(f"policies[{i}].{params}: expected a mapping, got {m[params]!r}")
                custom[m["label"]] = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in m.items() if k != "label"}
                pols[i] = m["label"]
        kw["custom_policies"] = custom
        bad = [p for p in pols if p not in custom and not _known_policy(p)]
        if bad or not pols:
            raise ScenarioError(
                f"policies: unknown {bad!r} (known: {', '.join(POLICIES)}, or SCHEDULE+PRIORITY such as optimal+level)"
            )
        if twice := sorted({p for p in pols if pols.count(p) > 1}):
            raise ScenarioError(f"policies: {', '.join(map(repr, twice))} listed twice (a label names one policy)")
        kw["policies"] = tuple(pols)
    if "refetch" in data:
        kw["refetch"] = _refetch(data["refetch"], kw, budget_given="budget" in data)
    if "scent_delta_s" in data:
        kw["scent_delta_s"] = _numbers(data["scent_delta_s"], "scent_delta_s")
    if "tick_minutes" in data:
        kw["tick_minutes"] = _number(data["tick_minutes"], "tick_minutes", low=1e-3)
    horizon = kw.get("horizon_days", d.horizon_days)
    ticks = horizon * 1440 / kw.get("tick_minutes", d.tick_minutes)
    if abs(ticks - round(ticks)) > 1e-6 * max(ticks, 1.0) or round(ticks) < 1:
        raise ScenarioError("tick_minutes: must divide horizon_days into whole ticks")
    if "hosts" in data:
        if not isinstance(data["hosts"], list) or not data["hosts"]:
            raise ScenarioError(f"hosts: expected a list of {{share, delay_s}}, got {data['hosts']!r}")
        hosts = []
        for i, h in enumerate(data["hosts"]):
            h = _mapping(h, f"hosts[{i}]", {"share", "delay_s"})
            hosts.append((_number(h.get("share"), f"hosts[{i}].share", low=0, high=1),
                          _number(h.get("delay_s"), f"hosts[{i}].delay_s", low=1e-3)))
        if abs(sum(a for a, _ in hosts) - 1.0) > 1e-6:
            raise ScenarioError("hosts: the shares must add up to 1")
        kw["hosts_politeness"] = tuple(hosts)
    if "lastmod" in data:
        lm = _mapping(data["lastmod"], "lastmod",
                      {"share", "lag_days", "bogus_share", "build_hours", "sitemap_hours", "header"})
        if lm.get("header", True) not in (True, False):  # 1.0 and 0.0 as results.json writes them
            raise ScenarioError(f"lastmod.header: expected true or false, got {lm['header']!r}")
        kw["lastmod"] = {"share": _number(lm.get("share", 1.0), "lastmod.share", low=0, high=1),
                         "lag_days": _number(lm.get("lag_days", 0.0), "lastmod.lag_days", low=0),
                         "bogus_share": _number(lm.get("bogus_share", 0.0), "lastmod.bogus_share", low=0, high=1),
                         "build_hours": _number(lm.get("build_hours", 0.0), "lastmod.build_hours", low=0),
                         "sitemap_hours": _number(lm.get("sitemap_hours", 0.0), "lastmod.sitemap_hours", low=0),
                         "header": float(lm.get("header", True))}
    if "sections" in data:
        sec = _mapping(data["sections"], "sections", {"count", "strength"})
        kw["sections"] = {"count": _whole(sec.get("count", 0), "sections.count", low=0),
                          "strength": _number(sec.get("strength", 0.0), "sections.strength", low=0, high=1)}
    if "changefreq" in data:
        cf = _mapping(data["changefreq"], "changefreq", {"share", "noise"})
        kw["changefreq"] = {"share": _number(cf.get("share", 1.0), "changefreq.share", low=0, high=1),
                            "noise": _number(cf.get("noise", 0.0), "changefreq.noise", low=0, high=1)}
    _check_policies(kw.get("custom_policies", {}), kw.get("refetch", d.refetch))
    return Scenario(**kw)


#: A site config's ``refetch`` keys the simulator takes: the schedule and
#: its parameters are each policy's (``policies``).
_REFETCH_KEYS = {"initial", "min", "max", "factor", "ahead", "budget"}


def _refetch(value: Any, kw: dict[str, Any], *, budget_given: bool) -> dict[str, float]:
    """``refetch`` read by the crawler's own reader, so that a value means
    here what it means in a site config; ``budget`` in fetches a day is
    ``budget: {fetches_per_day: [..]}``."""
    if isinstance(value, Mapping) and (unknown := set(value) - _REFETCH_KEYS):
        raise ScenarioError(f"refetch: unknown key(s) {', '.join(sorted(map(str, unknown)))} (known: "
                            f"{', '.join(sorted(_REFETCH_KEYS))}; the schedule and its parameters are "
                            f"each policy's, in policies)")
    try:
        ref = parse_refetch(value)
    except ConfigError as exc:
        raise ScenarioError(f"{exc.key}: {exc.problem}") from None
    if ref.budget is not None:
        if budget_given:
            raise ScenarioError("refetch.budget: give the budget once, here or in budget:")
        kw["budget_kind"], kw["budgets"] = "fetches_per_day", (ref.budget,)
    elif isinstance(value, Mapping) and value.get("budget") is not None:
        raise ScenarioError("refetch.budget: auto is what politeness allows, which the simulator does not "
                            "derive; give fetches a day (e.g. 5000/d), or a budget: block")
    return {"initial": ref.initial, "min": ref.min, "max": ref.max, "factor": ref.factor, "ahead": ref.ahead}


def _check_policies(custom: Mapping[str, Mapping[str, Any]], refetch: Mapping[str, float]) -> None:
    """Build each custom policy once, so that a parameter it does not take
    stops the scenario here, named, not in a worker halfway through."""
    from vertical.policies import make_priority, make_schedule

    base = {"initial": refetch["initial"], "min_delay": refetch["min"], "max_delay": refetch["max"],
            "factor": refetch["factor"]}
    for label, policy in custom.items():
        try:
            make_priority(policy["priority"], **policy.get("priority_params", {}))
            make_schedule(policy["schedule"], **{**base, **policy.get("schedule_params", {})})
        except ValueError as exc:
            raise ScenarioError(f"policies: {label}: {exc}") from None


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file; errors name the file."""
    path = Path(path)
    try:
        data = load_yaml(path.read_text(encoding="utf-8"), str(path))
        return parse_scenario(data or {})
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{path}: {exc}") from None
    except ConfigError as exc:
        raise ScenarioError(str(exc)) from None
    except ScenarioError as exc:
        raise ScenarioError(f"{path}: {exc}") from None
