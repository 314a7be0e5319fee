"""How pages in legacy encodings decode, declared or not: real Russian and
Japanese text, the way the crawler decodes it (Scrapy's ``HtmlResponse``:
HTTP header, then BOM, then ``<meta>``, then ``charset-normalizer``).

    python benchmarks/encodings/run.py [--locale /usr/share/locale] [--out benchmarks/encodings/results.json]

The text is the translations in the system's gettext catalogues
(``LOCALE/{ru,ja}/LC_MESSAGES/*.mo``: the Russian and Japanese messages of
apt, grep, bash, ...), real sentences written by people. Pages of three
sizes are cut from them, each encoded in every encoding the issue names
(windows-1251 and KOI8-R for Russian, Shift_JIS and EUC-JP for Japanese),
declared in the ``Content-Type`` header, in a ``<meta charset>``, or not at
all; a page decodes correctly when the text of its ``<p>`` comes back as a
browser shows it (the WHATWG decoder of the label: Shift_JIS is Windows-31J).
Only messages that are not pure ASCII are used.
"""

from __future__ import annotations

import argparse
import gettext
import json
import random
from collections import defaultdict
from html import escape
from pathlib import Path

from scrapy.http import HtmlResponse

ROOT = Path(__file__).resolve().parents[2]
ENCODINGS = {"ru": ("cp1251", "koi8_r", "utf-8"), "ja": ("shift_jis", "euc_jp", "utf-8")}
NAMES = {"cp1251": "windows-1251", "koi8_r": "KOI8-R", "shift_jis": "Shift_JIS", "euc_jp": "EUC-JP", "utf-8": "UTF-8"}
WHATWG = {"shift_jis": "cp932"}
SIZES = (100, 500, 2000)  # characters of text a page
PAGES = 200  # a size, a language


def messages(locale: Path, lang: str) -> list[str]:
    """Translated strings of every catalogue of ``lang`` that every encoding of the language can hold."""
    out = []
    for mo in sorted((locale / lang / "LC_MESSAGES").glob("*.mo")):
        try:
            with mo.open("rb") as f:
                catalog = gettext.GNUTranslations(f)._catalog  # type: ignore[attr-defined]
        except (OSError, UnicodeDecodeError, gettext.error if hasattr(gettext, "error") else OSError):
            continue
        for msgid, msgstr in catalog.items():
            if not msgid or not isinstance(msgstr, str):
                continue
            text = " ".join(msgstr.replace("%", " ").split())
            if len(text) < 20 or text.isascii() or not text.isprintable() \
                    or not all(_encodable(text, e) for e in ENCODINGS[lang]):
                continue
            out.append(text)
    return out


def _encodable(text: str, encoding: str) -> bool:
    try:
        text.encode(encoding)
    except UnicodeEncodeError:
        return False
    return True


def pages(texts: list[str], size: int, rng: random.Random) -> list[str]:
    out = []
    for _ in range(PAGES):
        words: list[str] = []
        while sum(len(w) + 1 for w in words) < size:
            words.append(rng.choice(texts))
        out.append(" ".join(words)[:size])
    return out


def decodes(text: str, encoding: str, declared: str) -> tuple[bool, str]:
    label = NAMES[encoding]
    meta = f'<meta charset="{label}">' if declared == "meta" else ""
    html = f"<html><head>{meta}<title>t</title></head><body><p>{escape(text)}</p></body></html>"
    headers = {"Content-Type": f"text/html; charset={label}" if declared == "header" else "text/html"}
    body = html.encode(encoding)
    response = HtmlResponse("http://example.com/", body=body, headers=headers)
    # What a browser shows: the WHATWG decoder of the label (Shift_JIS is
    # Windows-31J there: 0x8160 is U+FF5E, not Python's U+301C).
    shown = text.encode(encoding).decode(WHATWG.get(encoding, encoding))
    return response.xpath("string(//p)").get() == shown, response.encoding


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--locale", type=Path, default=Path("/usr/share/locale"))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "encodings" / "results.json")
    args = parser.parse_args()
    rng = random.Random(14)
    results: dict = {"messages": {}, "table": []}
    for lang, encodings in ENCODINGS.items():
        texts = messages(args.locale, lang)
        results["messages"][lang] = len(texts)
        for size in SIZES:
            sample = pages(texts, size, rng)
            for encoding in encodings:
                for declared in ("header", "meta", "none"):
                    ok, wrong = 0, defaultdict(int)
                    for text in sample:
                        good, got = decodes(text, encoding, declared)
                        ok += good
                        if not good:
                            wrong[got] += 1
                    row = {"language": lang, "chars": size, "encoding": NAMES[encoding], "declared": declared,
                           "pages": len(sample), "correct": ok, "taken_for": dict(wrong)}
                    results["table"].append(row)
                    print(row, flush=True)
    args.out.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
