"""vertical: an incremental, site-config-driven crawler for vertical search, built on Scrapy."""

__version__ = "0.1.0"
