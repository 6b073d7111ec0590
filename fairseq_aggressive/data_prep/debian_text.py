"""Texts of the Debian English-German corpus (scripts/data/prepare_debian_ende.py):
cleaning, pairing per source format (Ding lines, help pages, .mo catalogues),
filtering, deduplication and splitting.  No I/O beyond the bytes given."""
import collections
import html
import random
import re
import struct

MIN_WORDS, MAX_WORDS, MAX_RATIO = 4, 60, 2.0
MAX_COPIED = 0.6  # pairs whose German words are this much copied from the English are dropped

# The German .mo catalogues of a package: .../de/LC_MESSAGES/*.mo (not de_AT etc.).
GERMAN_MO = re.compile(r"/de/LC_MESSAGES/[^/]+\.mo$")


# --------------------------------------------------------------------------
# Text helpers


def normalize_space(text):
    return " ".join(text.split())


# A typographic apostrophe between letters (he’s, geht’s) -> ASCII, so that the
# sources agree and Moses treats English contractions as usual.
TYPOGRAPHIC_APOSTROPHE = re.compile(r"(?<=\w)[’ʼ](?=\w)")


def normalize_text(text):
    return TYPOGRAPHIC_APOSTROPHE.sub("'", normalize_space(text))


TAG = re.compile(r"</?([A-Za-z][\w:.-]*)(?:\s[^<>]*)?/?>")
# Tags that separate words; other (inline) tags are removed without a space.
BLOCK_TAGS = {"br", "p", "div", "li", "ul", "ol", "td", "th", "tr", "table", "h1", "h2",
              "h3", "h4", "h5", "h6", "img", "header", "section", "pre", "dd", "dt", "dl"}


def strip_tags(text, only=None):
    """Remove markup tags (all, or those named in `only`) and decode HTML entities."""
    def replace(match):
        name = match.group(1).lower()
        if only is not None and name not in only:
            return match.group()
        return " " if name in BLOCK_TAGS else ""
    return html.unescape(TAG.sub(replace, text))


# --------------------------------------------------------------------------
# Ding dictionary (trans-de-en)

DING_ANNOTATION = re.compile(r"\s*(?:\{[^{}]*\}|\[[^\[\]]*\]|<[^<>]*>)")
SENTENCE_START = re.compile(r"^[\"'„“‚‘»«(¿¡]*[A-ZÄÖÜ0-9]")
SENTENCE_END = re.compile(r"[.!?…][\"'“”‘’»«)]*$")
DING_PLACEHOLDER = re.compile(r"(?<!\w)(?:sb|sth|jd|jdn|jdm|jds|etw)\.")


def clean_ding(text):
    """One side of a Ding part without annotations, first alternative only."""
    text = DING_ANNOTATION.sub("", text)
    return normalize_space(text.split(";")[0])


def looks_like_sentence(text):
    return (len(text.split()) >= 3 and "/" not in text
            and SENTENCE_START.match(text) is not None
            and SENTENCE_END.search(text) is not None
            and DING_PLACEHOLDER.search(text) is None)


def ding_pairs(lines):
    """(english, german) example sentences of Ding ``German :: English`` lines."""
    for line in lines:
        line = line.rstrip("\n")
        if line.startswith("#") or line.count(" :: ") != 1:
            continue
        german, english = line.split(" :: ")
        de_parts, en_parts = german.split(" | "), english.split(" | ")
        if len(de_parts) != len(en_parts):
            continue
        for de, en in zip(de_parts, en_parts):
            de, en = clean_ding(de), clean_ding(en)
            if looks_like_sentence(de) and looks_like_sentence(en):
                yield en, de


# --------------------------------------------------------------------------
# LibreOffice help pages

HELP_ELEMENT = re.compile(r"<(p|h[1-6])\b([^>]*)>(.*?)</\1\s*>", re.S)
HELP_ID = re.compile(r"\bid=\"((?:par|hd)_id[^\"]*)\"")


def help_paragraphs(page):
    """{(id, occurrence): text} of the identified paragraphs/headings of a page."""
    paragraphs, seen = {}, collections.Counter()
    for match in HELP_ELEMENT.finditer(page):
        ident = HELP_ID.search(match.group(2))
        if not ident:
            continue
        key = (ident.group(1), seen[ident.group(1)])
        seen[ident.group(1)] += 1
        paragraphs[key] = normalize_space(strip_tags(match.group(3)))
    return paragraphs


def help_pairs(english_pages, german_pages):
    """(english, german) paragraphs with the same id in the same page.

    Both arguments map a page path (relative to the language folder) to HTML.
    """
    for path in sorted(english_pages.keys() & german_pages.keys()):
        english = help_paragraphs(english_pages[path])
        german = help_paragraphs(german_pages[path])
        for key in sorted(english.keys() & german.keys()):
            if english[key] and german[key]:
                yield english[key], german[key]


PARAGRAPH = re.compile(r"<p\b[^>]*>(.*?)</p\s*>", re.S)


def ordered_paragraph_pairs(english_pages, german_pages, stats=None):
    """(english, german) <p> paragraphs paired by position in the same page.

    For help pages built from one DocBook source per language (GIMP help):
    pages whose paragraph counts differ are skipped.
    """
    for path in sorted(english_pages.keys() & german_pages.keys()):
        english = [normalize_space(strip_tags(p)) for p in PARAGRAPH.findall(english_pages[path])]
        german = [normalize_space(strip_tags(p)) for p in PARAGRAPH.findall(german_pages[path])]
        if len(english) != len(german):
            if stats is not None:
                stats["pages skipped (paragraph counts differ)"] += 1
            continue
        for en, de in zip(english, german):
            if en and de:
                yield en, de


# --------------------------------------------------------------------------
# gettext catalogues


def read_mo(data):
    """[(msgid, msgstr), ...] of a compiled gettext catalogue (raw strings)."""
    if len(data) < 20:
        raise ValueError("not a .mo file (too short)")
    for order in "<>":
        if struct.unpack(order + "I", data[:4])[0] == 0x950412DE:
            break
    else:
        raise ValueError("not a .mo file (bad magic number)")
    count, ids_at, strs_at = struct.unpack(order + "3I", data[8:20])

    def string(table, i):
        length, offset = struct.unpack_from(order + "2I", data, table + 8 * i)
        return data[offset:offset + length].decode("utf-8", errors="replace")
    return [(string(ids_at, i), string(strs_at, i)) for i in range(count)]


# Wesnoth help markup: <italic>text='Strong'</italic> -> Strong
WESNOTH_TEXT_TAG = re.compile(r"<(\w+)>[^<>]*?\btext='([^']*)'[^<>]*</\1>")
WESNOTH_IMAGE = re.compile(r"<img>.*?</img>")
# Prefixes that select a variant of a message: female^ (Wesnoth), ?nation: (Freeciv)
MESSAGE_QUALIFIER = re.compile(r"^(?:\w+\^|\?[\w ]+:)")
PLACEHOLDER = re.compile(
    r"%(?:\d+\$)?q?[-+#0]*(?:\d+|\*)?(?:\.(?:\d+|\*))?[A-Za-z<>{]"  # %s %.*s %qD %< %VAR%
    r"|%\(\w+\)|%\d"                        # python %(name)s, Qt %1
    r"|\$\(?[\w{]"                          # $var, $(ARG1), ${x}, $2
    r"|\{[\w.:,!|-]*\}|#[A-Z]+#|\bXX\b"     # {0}, {}, #PAGECOUNT#, XX
)
# Keyboard accelerators: _Open (GTK), ~Open / Dokument~vorlage (LibreOffice), &Open (Qt)
MNEMONIC = re.compile(r"(?:^|(?<=[\s(]))[_~&](?=\w)|(?<=\w)[~_](?=\w)"
                      r"|(?<=[a-zäöüß])&(?=[a-zäöüß])")
# Markup used in the catalogues: Pango/HTML and Wesnoth's help tags.  Other
# <words> are placeholders (<n>, <file>) and make the message unusable.
MESSAGE_TAGS = {"b", "i", "u", "s", "big", "small", "span", "tt", "sub", "sup", "a", "br",
                "p", "em", "strong", "font", "code", "kbd", "ref", "italic", "bold",
                "header", "format", "jump", "nobr", "qt", "html", "body", "ul", "ol", "li"}


def clean_message(text):
    """Plain text of a catalogue message, or None if it has placeholders."""
    text = text.replace("%PRODUCTNAME", "LibreOffice")
    text = MESSAGE_QUALIFIER.sub("", text)
    text = WESNOTH_IMAGE.sub(" ", text)
    text = WESNOTH_TEXT_TAG.sub(r"\2", text)
    text = strip_tags(text, only=MESSAGE_TAGS)
    if PLACEHOLDER.search(text) or "<" in text or ">" in text:
        return None
    text = MNEMONIC.sub("", text.replace("&&", "\x00")).replace("\x00", "&")  # Qt: && is &
    return normalize_space(text)


PARAGRAPH_BREAK = re.compile(r"\n\s*\n")


def mo_pairs(entries):
    """(english, german) pairs of a catalogue's (msgid, msgstr) entries."""
    for msgid, msgstr in entries:
        msgid = msgid.split("\x04")[-1].split("\x00")[0]   # no context; singular
        msgstr = msgstr.split("\x00")[0]
        if not msgid.strip() or not msgstr.strip():
            continue
        english = PARAGRAPH_BREAK.split(msgid.strip())
        german = PARAGRAPH_BREAK.split(msgstr.strip())
        if len(english) != len(german):
            english, german = [msgid], [msgstr]
        for en, de in zip(english, german):
            en, de = clean_message(en), clean_message(de)
            if en and de:
                yield en, de


# --------------------------------------------------------------------------
# Filtering, deduplication, splitting


def dedup_key(text):
    return re.sub(r"[\W_]+", "", text.lower())


WORD = re.compile(r"[^\W\d_]{2,}")


def copied_share(en, de):
    """Share of the German side's words that occur in the English side too.

    High for untranslated or half-translated text (``Abbildung 3.1. Saturation
    Options``); names and code make it high in some good pairs too.
    """
    english = {word.lower() for word in WORD.findall(en)}
    german = [word.lower() for word in WORD.findall(de)]
    return sum(word in english for word in german) / len(german) if german else 1.0


def filter_reason(en, de):
    """Why a pair is dropped, or None to keep it."""
    en_words, de_words = len(en.split()), len(de.split())
    if min(en_words, de_words) < MIN_WORDS:
        return "too short"
    if max(en_words, de_words) > MAX_WORDS:
        return "too long"
    if (max(en_words, de_words) > MAX_RATIO * min(en_words, de_words)
            or max(len(en), len(de)) > MAX_RATIO * min(len(en), len(de))):
        return "length ratio"
    if dedup_key(en) == dedup_key(de) or copied_share(en, de) >= MAX_COPIED:
        return "untranslated"
    return None


def clean_corpus(raw_pairs):
    """Filter and deduplicate {source: [(en, de) or (en, de, package), ...]}.

    Sources are taken in order (the first of duplicates is kept).  Returns
    [(en, de, origin), ...], where origin is ``source`` or ``source/package``,
    and a {source: Counter} of statistics.
    """
    kept, stats = [], collections.OrderedDict()
    seen_en, seen_de = set(), set()
    for source, pairs in raw_pairs.items():
        counter = stats[source] = collections.Counter()
        for en, de, *package in pairs:
            counter["extracted"] += 1
            en, de = normalize_text(en), normalize_text(de)
            reason = filter_reason(en, de)
            if reason is None:
                en_key, de_key = dedup_key(en), dedup_key(de)
                if en_key in seen_en or de_key in seen_de:
                    reason = "duplicate"
                else:
                    seen_en.add(en_key)
                    seen_de.add(de_key)
            if reason:
                counter["dropped: " + reason] += 1
            else:
                counter["kept"] += 1
                kept.append((en, de, "/".join([source, *package])))
    return kept, stats


def split_corpus(pairs, valid_size, test_size, seed, max_pairs=None):
    """Shuffle deterministically and cut into {split: [(en, de, source), ...]}."""
    pairs = list(pairs)
    random.Random(seed).shuffle(pairs)
    if max_pairs:
        pairs = pairs[:max_pairs]
    if valid_size + test_size >= len(pairs):
        raise ValueError(f"only {len(pairs)} pairs: not enough for {valid_size} valid "
                         f"+ {test_size} test pairs and a training set")
    return {"test": pairs[:test_size],
            "valid": pairs[test_size:test_size + valid_size],
            "train": pairs[test_size + valid_size:]}
