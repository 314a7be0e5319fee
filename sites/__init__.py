"""Site configs shipped with the project (package data, so they travel inside a Scrapyd egg)."""
