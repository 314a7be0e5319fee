"""The bundled demo site: a deterministic, step-by-step changing film catalogue
(:class:`DemoSite`), a large plain site for benchmarks (:class:`BulkSite`), a site
full of crawler traps (:class:`WildSite`), and a
loopback HTTP server for both (:func:`serve`, ``python -m vertical.demo``)."""

from vertical.demo.server import DemoServer, serve
from vertical.demo.site import BulkSite, DemoResponse, DemoSite, Film
from vertical.demo.wild import WildSite

__all__ = ["BulkSite", "DemoResponse", "DemoServer", "DemoSite", "Film", "WildSite", "serve"]
