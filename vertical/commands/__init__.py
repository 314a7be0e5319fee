"""Scrapy commands of the project (``COMMANDS_MODULE = "vertical.commands"``)."""
