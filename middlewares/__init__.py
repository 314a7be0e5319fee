"""Scrapy components of vertical: robots.txt, DNS cache and prefetch, trap guards,
conditional requests."""
