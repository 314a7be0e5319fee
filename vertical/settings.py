"""Scrapy settings of the ``vertical`` project; every ``VERTICAL_*`` default lives here.

Per-site politeness (delay, concurrency) comes from the site config and is
applied to Scrapy's download slots by the spider; these are the project-wide
defaults and switches.
"""

BOT_NAME = "vertical"
SPIDER_MODULES = ["spiders"]
NEWSPIDER_MODULE = "spiders"
COMMANDS_MODULE = "vertical.commands"

# -- the frontier -----------------------------------------------------------
# Where URL records live: sqlite:///relative/path (under the working
# directory), sqlite:////absolute/path, or redis://host:port/db.
VERTICAL_STORE = "sqlite:///.vertical/frontier.sqlite3"
# Folder of site configs looked up by name (before the bundled `sites` package).
VERTICAL_SITES = "sites"
# A claimed URL belongs to its crawl process for this long; leases of live
# processes are renewed, those of killed ones run out and their URLs return.
VERTICAL_LEASE = 600
# Seconds between a crawl process's heartbeats in the store. A process that
# misses three (or whose pid is gone, on the same machine) is taken for dead
# and its claims are released at once, whatever their lease.
VERTICAL_HEARTBEAT = 10
# Seconds a crawl goes on while its store takes no write and its calls keep
# failing (a full disk, a file another program holds locked); then it closes
# (finish reason store_unavailable, exit status 1). A Redis store also waits
# out its own ?patience= (default 300) within each call.
VERTICAL_STORE_PATIENCE = 300.0
# Seconds a URL rejected by a trap guard is left alone before it is looked at
# again (the guards may have changed, an oversized answer may have been a one-off).
VERTICAL_TRAP_RECHECK = 30 * 86400
# Records claimed from the store per refill of the in-memory host queues.
VERTICAL_CLAIM_BATCH = 256
# Page-record writes are batched: flushed at this size or this age (seconds).
VERTICAL_WRITE_BATCH = 200
VERTICAL_WRITE_INTERVAL = 1.0
# Run budgets (0 = none): pages fetched and seconds per run (`-a pages=`, `-a seconds=`).
VERTICAL_MAX_PAGES = 0
VERTICAL_MAX_SECONDS = 0
# Seconds added to the wall clock: lets tests and operators replay "later".
VERTICAL_TIME_OFFSET = 0.0
# Seen-test sizing (Bloom filter in front of the store, cache of known URLs).
VERTICAL_SEEN_CAPACITY = 1_000_000
VERTICAL_SEEN_ERROR_RATE = 0.001
VERTICAL_SEEN_CACHE = 2**18
# Seconds between saves of the seen filter with the store (0: at close only).
VERTICAL_SEEN_SAVE = 600.0
# Seconds between saves of what the policies learned (the site's change
# rates, the price of a fetch, the sitemap's checked claims) with the store,
# merged with other processes' (0: at close only; a killed crawl loses what
# it learned since its last save).
VERTICAL_STATE_SAVE = 300.0
# Seconds between refits of a continuous crawl's schedule to what it learned
# since it opened: the site's change rates and the price of a fetch (0: at
# open only; a run of another mode refits when the next one opens).
VERTICAL_REFIT_INTERVAL = 86400.0

# Final stats as JSON, when set (for scripts and Scrapyd monitors).
VERTICAL_STATS_FILE = None

SCHEDULER = "vertical.scheduler.FrontierScheduler"

EXTENSIONS = {
    # The commit of fetched pages to the frontier (vertical/commit.py).
    "vertical.commit.FrontierCommit": 0,
    "vertical.extensions.StatsFile": 0,
    # A continuous Scrapyd job stops when its Scrapyd is gone.
    "vertical.extensions.ScrapydOrphan": 0,
    # A host's politeness delay counts from the end of its last download.
    "vertical.extensions.DelayAfterDownload": 0,
    "middlewares.dns.DNSCacheStats": 0,
    "vertical.progress.CrawlProgress": 0,
    "pipelines.repository.WarcWriter": 0,
    "pipelines.repository.PageMirror": 0,
    "vertical.metrics.PrometheusMetrics": 0,
}

# -- page repository and monitoring ----------------------------------------------
# WARC files of every fetched page (revisits for unchanged ones), rotated at
# this many bytes; None = off. (pipelines/repository.py)
VERTICAL_WARC_DIR = None
VERTICAL_WARC_MAX_SIZE = 1_000_000_000
# Latest copy of each page as a file, gone pages under archive/; None = off.
VERTICAL_MIRROR_DIR = None
# Seconds between progress lines (pages/min, due backlog, ETA); 0 = off.
VERTICAL_PROGRESS_INTERVAL = 60
# Prometheus metrics of each crawl process on http://ADDRESS:PORT/metrics
# (vertical/metrics.py; needs the `metrics` extra); 0 = off. Every process
# needs its own port. The address is loopback unless you open it.
VERTICAL_METRICS_PORT = 0
VERTICAL_METRICS_ADDRESS = "127.0.0.1"

DOWNLOADER_MIDDLEWARES = {
    # Scrapy's robots.txt handling, plus expiry, Crawl-delay and host postponement.
    "scrapy.downloadermiddlewares.robotstxt.RobotsTxtMiddleware": None,
    "middlewares.robots.RobotsMiddleware": 100,
    # A robots.txt compressed against our asking, inflated up to the 500 KiB
    # read, before Scrapy's HttpCompressionMiddleware (590) inflates it whole.
    "middlewares.robots.RobotsInflateMiddleware": 595,
    "middlewares.conditional.ConditionalRequestMiddleware": 560,
    # 429, and 503 with Retry-After, postpone the host, before Scrapy's
    # RetryMiddleware (550) would ask again at once.
    "middlewares.backoff.HostBackoffMiddleware": 555,
    # Responses pass 585 before 575: traps are dropped before they are hashed,
    # both after decompression (590) and redirects (600).
    "middlewares.duplicates.DuplicateContentMiddleware": 575,
    "middlewares.traps.TrapGuardMiddleware": 585,
    # Redirects of frontier requests become links in the frontier, within
    # allowed_domains: 3xx before Scrapy's RedirectMiddleware (600), meta
    # refresh after decompression (590) and before MetaRefreshMiddleware (580).
    "middlewares.redirects.FrontierRedirectMiddleware": 610,
    "middlewares.redirects.FrontierMetaRefreshMiddleware": 582,
    # Redis stores only: one request rate per host for all crawl processes.
    # Last to see a request, so that nothing after it drops or delays one.
    "middlewares.hostrate.HostRateMiddleware": 950,
}

ITEM_PIPELINES = {}

# -- fetching ---------------------------------------------------------------
ROBOTSTXT_OBEY = True
# A host's robots.txt is fetched again after this many seconds; when it
# answers 5xx/429 or fails, the host is left alone this long.
VERTICAL_ROBOTS_TTL = 86400
VERTICAL_ROBOTS_POSTPONE = 3600
# The longest a page's Retry-After (on a 429 or 503) leaves its host alone.
VERTICAL_RETRY_AFTER_MAX = 3600
# A sitemap is read again (conditionally) this many seconds after it was last
# read by any process of the site, while a crawl runs; a run reads at its
# start those not read within half of it (0: once a run, as a SitemapSpider
# does); an index nested deeper than VERTICAL_SITEMAP_DEPTH below the
# sitemap named is not followed (the protocol nests none: an index lists
# sitemaps).
VERTICAL_SITEMAP_TTL = 86400
VERTICAL_SITEMAP_DEPTH = 2
# A sitemap whose reading failed (no answer, or an error after the retries)
# is asked for again this many seconds later, doubled at each failure in a
# row, and never later than after a reading made: a server error at one run
# should not hide the sitemap's new pages for half a day. (StormCrawler
# retries a fetch error after two hours.)
VERTICAL_SITEMAP_RETRY = 3600
# The RSS and Atom feeds an entry page links in its head are read as sitemaps.
VERTICAL_FEED_DISCOVERY = True
CONCURRENT_REQUESTS = 16
# Scrapy starts this many item tasks for every response, whatever it yields
# (asyncio tasks that mostly wait for the end of the page's output): 100, the
# default, cost 1.4 ms a page, 32 0.5 ms; a page here yields its few
# documents, handed to the feed, and no pipeline of the project waits on I/O.
# Not 16 (0.3 ms): a crawl of the Django docs then peaked at 310-325 MB
# instead of 250-276 (garbage collected later, presumably: fewer allocations).
CONCURRENT_ITEMS = 32
CONCURRENT_REQUESTS_PER_DOMAIN = 1
DOWNLOAD_DELAY = 1.0
DOWNLOAD_DELAY_JITTER = 0
DOWNLOAD_TIMEOUT = 30
DOWNLOAD_MAXSIZE = 16 * 1024 * 1024
# Scrapy's HTTP/1.1 handler on a pool that does not reuse a connection being
# closed: a download stopped at its headers otherwise sent the next request
# on that connection twice (vertical/download.py).
DOWNLOAD_HANDLERS = {"http": "vertical.download.HTTPDownloadHandler",
                     "https": "vertical.download.HTTPDownloadHandler"}
DOWNLOAD_WARNSIZE = 4 * 1024 * 1024
RETRY_TIMES = 2
COOKIES_ENABLED = True
TELNETCONSOLE_ENABLED = False
USER_AGENT = "vertical/0.1 (+https://github.com/vertical-crawler/vertical)"
# The frontier is the dupefilter: it dedups across runs and processes.
DUPEFILTER_CLASS = "scrapy.dupefilters.BaseDupeFilter"

# DNS: a cache with expiry and negative answers, and prefetch of the hosts
# of extracted links (Mining the Web). VERTICAL_DNS_SERVERS = ["host:port"] asks
# those servers directly with Twisted Names instead of the system resolver.
TWISTED_DNS_RESOLVER = "middlewares.dns.CachingResolver"
VERTICAL_DNS_TTL = 3600
VERTICAL_DNS_NEGATIVE_TTL = 60
# Answers are cached at least this long, whatever TTL they carry (0: as they say).
VERTICAL_DNS_MIN_TTL = 0
VERTICAL_DNS_SERVERS = []

LOG_LEVEL = "INFO"
FEED_EXPORT_ENCODING = "utf-8"
