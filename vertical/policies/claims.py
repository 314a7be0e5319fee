"""Whether a site's sitemap lastmods can be believed.

A sitemap's ``<lastmod>`` that moved since a page's last fetch claims the page
changed. Many sitemaps date every page with the time they were generated (or
the site's last build), and such a claim says nothing: taken at its word it
makes the whole site due at every reading. Google, too, uses lastmod only
where it proves "consistently and verifiably accurate".

So a claim is checked by the page's next fetch, whatever brings it: a claim
is noted on the record (:func:`note_claim`) and the fetch weighs it
(:func:`check_claim`) as a likelihood ratio of "the lastmod dates the page's
changes" against "it moves whatever the page does". The site's share of
truthful pages is learned from those checks (:class:`SitemapTruth`), and a
page's claims are believed with the odds of that share and its own checks.

Pure Python, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

__all__ = ["CLAIMS_KEY", "CLAIM_KEY", "CLAIM_MISS", "SitemapTruth", "check_claim", "note_claim"]

#: Key of ``record.extra``: a sitemap read since the page's last fetch dates
#: a change after it, with these odds
#: (:func:`~vertical.policies.estimate.changed_after`).
CLAIM_KEY = "smc"
#: Key of ``record.extra``: what the page's fetches said of its sitemap
#: lastmod, a log likelihood ratio (nats) of "it dates the page's changes"
#: against "it moves whatever the page does".
CLAIMS_KEY = "sme"
#: The share of true claims a fetch does not bear out: a lastmod moved by a
#: change outside the fields the crawl extracts (a comment, the template).
CLAIM_MISS = 0.1
_SETTLED = 20.0  # nats: past this a page's evidence says no more


def note_claim(extra: MutableMapping[str, Any], odds: float) -> bool:
    """A sitemap dates a change of the page after its last fetch, with these
    ``odds``: keep the claim for the next fetch to check. Returns whether
    ``extra`` changed (a claim already pending stays, at the larger odds)."""
    pending = extra.get(CLAIM_KEY)
    if pending is not None and float(pending) >= odds:
        return False
    extra[CLAIM_KEY] = float(odds)
    return True


def check_claim(extra: MutableMapping[str, Any], changed: bool, anyway: float) -> float | None:
    """A fetch, ``changed`` or not, of a page with a claim pending
    (:func:`note_claim`): how far it bears the claim out, as the log
    likelihood ratio of two explanations of the page's lastmod.

    * It dates the page's changes: the page changed, unless the change was
      outside the extracted fields (:data:`CLAIM_MISS`), or came before
      the last fetch (``1 - odds``), and none of its other changes since
      (as likely as it changes anyway) was in them either. A true claim
      only adds a change to those the page has anyway: a page that changes
      at nearly every visit, found changed, says a little "true", never
      "false".
    * It moves whatever the page does: the page changed as it would anyway,
      with the odds ``anyway`` that its visits so far give a change since
      the last fetch (their predictive odds, not those of their mean rate:
      a page of uncertain rate may well be static).

    A page that changes at nearly every visit thus says little; a slow page
    found unchanged says "false" loud. The ratio is added to the page's
    evidence (:data:`CLAIMS_KEY`), which is returned; None without a claim."""
    odds = extra.pop(CLAIM_KEY, None)
    if odds is None:
        return None
    odds = min(max(float(odds), 0.0), 1.0)
    anyway = min(max(anyway, 1e-3), 1.0 - 1e-3)
    true = 1.0 - (1.0 - anyway) * (1.0 - odds * (1.0 - CLAIM_MISS))
    if not changed:
        true, anyway = 1.0 - true, 1.0 - anyway
    evidence = float(extra.get(CLAIMS_KEY, 0.0)) + math.log(true / anyway)
    extra[CLAIMS_KEY] = evidence = max(-_SETTLED, min(_SETTLED, evidence))
    return evidence


class SitemapTruth:
    """The share ``s`` of a site's pages whose sitemap lastmod dates their
    changes, learned from the fetches that checked their claims.

    A posterior over ``s`` on a grid from 0 to 1, with a third of the prior
    on each end: a sitemap's generator either dates its pages or stamps them
    all alike, and mixed sitemaps are the rarer case. With the ends in the
    prior a run of false claims soon settles on "none" (a flat prior keeps
    ``s`` near ``1/n`` after ``n`` of them, and a page whose fetch would buy
    ``n`` times its price would still be brought forward on its claim).

    A page is truthful or not as a whole: with evidence ``e``
    (:data:`CLAIMS_KEY`) its likelihood is ``s e^e + 1 - s``. The posterior
    is kept as one log likelihood per grid point, which the site's
    processes add up (:meth:`merge`). A page's odds (:meth:`trust`) start
    from the posterior that its own checks are part of: with hundreds of
    pages checked, the one counted twice weighs little."""

    GRID = 21

    def __init__(self, loglik: Sequence[float] | None = None, pages: float = 0.0) -> None:
        self.shares = [j / (self.GRID - 1) for j in range(self.GRID)]
        inner = (1.0 / 3.0) / (self.GRID - 2)
        self.log_prior = [math.log(1.0 / 3.0 if j in (0, self.GRID - 1) else inner) for j in range(self.GRID)]
        self.loglik = [0.0] * self.GRID
        if loglik is not None and len(loglik) == self.GRID:
            self.loglik = [float(x) for x in loglik]
        #: Pages checked so far.
        self.pages = float(pages)
        self._weights: list[float] | None = None

    def update(self, before: float | None, after: float) -> None:
        """A page's evidence moved from ``before`` (None: its first check) to ``after``."""
        if before is None:
            self.pages += 1
            before = 0.0
        lo, hi = math.exp(before), math.exp(after)
        self.loglik = [ll + math.log(s * hi + 1.0 - s) - math.log(s * lo + 1.0 - s)
                       for ll, s in zip(self.loglik, self.shares, strict=True)]
        self._weights = None

    def weights(self) -> list[float]:
        """The posterior over the grid."""
        if self._weights is None:
            logs = [p + ll for p, ll in zip(self.log_prior, self.loglik, strict=True)]
            top = max(logs)
            raw = [math.exp(x - top) for x in logs]
            total = sum(raw)
            self._weights = [x / total for x in raw]
        return self._weights

    @property
    def share(self) -> float:
        """The posterior mean of ``s``: a page's odds before its own checks."""
        return sum(w * s for w, s in zip(self.weights(), self.shares, strict=True))

    def trust(self, evidence: float) -> float:
        """The odds that a page with this evidence has a truthful lastmod."""
        if evidence == 0.0:
            return self.share
        ratio = math.exp(evidence)
        return sum(w * s * ratio / (s * ratio + 1.0 - s) for w, s in zip(self.weights(), self.shares, strict=True))

    def state(self) -> dict[str, Any]:
        return {"loglik": list(self.loglik), "pages": self.pages}

    @classmethod
    def from_state(cls, state: Any) -> SitemapTruth:
        """From :meth:`state` (anything else: nothing learned yet)."""
        loglik = state.get("loglik") if isinstance(state, Mapping) else None
        if not isinstance(loglik, list) or len(loglik) != cls.GRID:
            return cls()
        try:
            return cls(loglik, float(state.get("pages", 0.0)))
        except (TypeError, ValueError):
            return cls()

    def merge(self, stored: Any, opened: Any) -> dict[str, Any]:
        """The state to store: what the store holds (``stored``) plus what
        this process learned since it loaded ``opened``."""
        theirs, before = SitemapTruth.from_state(stored), SitemapTruth.from_state(opened)
        return {"loglik": [a + b - c for a, b, c in zip(theirs.loglik, self.loglik, before.loglik, strict=True)],
                "pages": max(0.0, theirs.pages + self.pages - before.pages)}
