#!/usr/bin/env python
"""Build an English-German parallel corpus offline from Debian packages.

Every text comes from a Debian package fetched with ``apt-get download`` (no
root, nothing installed); the .deb files are read with ``dpkg-deb
--fsys-tarfile`` (or, without dpkg-deb, by unpacking the ar archive in Python),
so nothing is extracted to disk.  Sources (``--sources``, default all):

``ding``
    The Ding dictionary (``trans-de-en``): lines ``German :: English`` whose
    ``|``-separated parts correspond one to one.  Only parts that look like
    full sentences on both sides are used (capitalised, ending in . ! ? or …,
    no ``sb./jdn.`` placeholders, no ``a/b`` alternatives); of ``;``-separated
    alternatives the first is taken.
``lo-help``
    LibreOffice help (``libreoffice-help-en-us`` + ``libreoffice-help-de``,
    HTML pages): paragraphs and headings with the same ``par_id``/``hd_id`` in
    the same page are paired.
``wesnoth``
    The German gettext catalogues (.mo) of Battle for Wesnoth: the data package
    and every campaign package of the newest branch apt knows.
``gimp-help``
    The GIMP manual (``gimp-help-en`` + ``gimp-help-de``, HTML pages built from
    one DocBook source): ``<p>`` paragraphs paired by position in the same
    page; pages whose paragraph counts differ are skipped.
``games``, ``apps``, ``tech``
    German .mo catalogues of Freeciv and Widelands; of LibreOffice's user
    interface, GIMP, Inkscape, GnuCash, calibre, Blender, digiKam, Gramps,
    Evolution, darktable, Gnumeric and LyX; of PostgreSQL, Git, GCC and
    coreutils (see ``all_sources``).

For .mo catalogues msgid (English) -> msgstr (German); contexts are dropped,
plural entries give their singular forms, messages whose blank-line separated
paragraphs correspond are split into them, markup (Pango, Wesnoth help tags)
is removed, and messages with format placeholders (%s, $var, {0}, ...) are
skipped.

Cleaning: whitespace normalised; pairs kept when both sides have 4-60 words,
the word and character length ratios are <= 2 and the sides differ (and less
than 60% of the German words occur in the English side); duplicate
sources and duplicate targets (compared lowercased, letters and digits only)
are dropped, so no valid/test source or target occurs in train.  The pairs are
shuffled with ``--seed`` and split into test, valid and train.

Output in ``--out`` (built in a temporary directory and moved in at the end):
``{split}.raw.{en,de}`` (untokenized, for sacrebleu), ``{split}.origin`` (the
source of every pair: ``ding``, ``lo-help``, ``apps/gimp-data``, ...), ``{split}.tok.{en,de}`` (Moses-tokenized),
``bpe.codes`` and ``{split}.{en,de}`` (joint BPE), ``bin/`` (fairseq-preprocess,
joined dictionary), ``packages.tsv`` (the .deb files used) and
``licences/PKG.copyright``.

Examples::

    python scripts/prepare_debian_ende.py --out work/ende
    python scripts/prepare_debian_ende.py --out /tmp/small --sources ding,wesnoth \\
        --max-pairs 20000 --bpe-ops 4000 --no-binarize
"""

import argparse
import collections
import html
import io
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.parse
import zipfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import prep_common  # noqa: E402  (scripts/prep_common.py: tokenize, BPE, binarize)
from prep_common import require, write_lines  # noqa: E402

SPLITS = prep_common.SPLITS
LANGS = ("en", "de")

MIN_WORDS, MAX_WORDS, MAX_RATIO = 4, 60, 2.0
MAX_COPIED = 0.6  # pairs whose German words are this much copied from the English are dropped

# Wesnoth campaign packages are named wesnoth-BRANCH-ABBREV; these are not campaigns.
WESNOTH_NOT_TEXT = {"core", "music", "server", "tools", "data"}

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


# --------------------------------------------------------------------------
# Debian packages


class Source:
    def __init__(self, name, description, packages, reader):
        self.name, self.description = name, description
        self.packages, self.reader = packages, reader


def run(command, **kwargs):
    return subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, **kwargs)


def known_packages(prefix, cache):
    """Names of the packages starting with `prefix` that apt (or else the cache) knows."""
    names = []
    if shutil.which("apt-cache"):
        names = run(["apt-cache", "pkgnames", prefix]).stdout.split()
    if not names:  # offline without apt lists: use what the cache holds
        names = [deb.name.split("_")[0] for deb in Path(cache).glob(prefix + "*.deb")]
    return sorted(set(names))


def newest(pattern, cache):
    """The package matching `pattern` (version in group 1, e.g. gcc-(\\d+)-locales)
    with the highest version, e.g. ``gcc-12-locales``."""
    regex = re.compile(f"^{pattern}$")
    prefix = pattern[:pattern.index("(")]
    matches = [(tuple(map(int, m.group(1).split("."))), m.group(0))
               for m in map(regex.match, known_packages(prefix, cache)) if m]
    if not matches:
        sys.exit(f"error: apt-cache knows no package named {pattern}; run `apt-get update` "
                 "(as root), or leave its source out with --sources")
    return max(matches)[1]


def wesnoth_packages(cache):
    """The data and campaign packages of the newest Wesnoth branch."""
    data = newest(r"wesnoth-(\d+\.\d+)-data", cache)
    branch = data[len("wesnoth-"):-len("-data")]
    campaign = re.compile(rf"^wesnoth-{re.escape(branch)}-([a-z]+)$")
    return [data] + [name for name in known_packages(f"wesnoth-{branch}-", cache)
                     if campaign.match(name)
                     and campaign.match(name).group(1) not in WESNOTH_NOT_TEXT]


def cached_deb(cache, package):
    debs = sorted(Path(cache).glob(f"{package}_*.deb"))
    return debs[-1] if debs else None


def download(packages, cache):
    """{package: .deb path}; downloads the packages that the cache lacks."""
    cache = Path(cache)
    cache.mkdir(parents=True, exist_ok=True)
    missing = [p for p in packages if cached_deb(cache, p) is None]
    if missing:
        if not shutil.which("apt-get"):
            sys.exit("error: apt-get not found; put the .deb files of these packages in "
                     f"{cache}: {' '.join(missing)}")
        print(f"Downloading {len(missing)} packages into {cache}: {' '.join(missing)}")
        # Download into a scratch folder and move complete files only.
        with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as scratch:
            result = run(["apt-get", "download", *missing], cwd=scratch)
            if result.returncode:
                errors = [line for line in result.stderr.splitlines()
                          if not line.startswith("W:")] or result.stderr.splitlines()
                hint = ("the package is unknown to apt: run `apt-get update` (as root), or "
                        "leave its source out with --sources"
                        if "Unable to locate" in result.stderr or "no installation candidate"
                        in result.stderr else
                        "is the Debian mirror reachable? Without network, put the .deb files "
                        f"in {cache} (see --cache)")
                sys.exit("error: `apt-get download` failed:\n  " + "\n  ".join(errors[-8:])
                         + f"\n{hint}")
            for deb in Path(scratch).glob("*.deb"):
                deb.rename(cache / deb.name)
    debs = {p: cached_deb(cache, p) for p in packages}
    lost = [p for p, deb in debs.items() if deb is None]
    if lost:
        sys.exit(f"error: apt-get download gave no .deb for: {' '.join(lost)}")
    return debs


def read_ar(stream):
    """{member name: bytes} of an ar archive (the container of a .deb)."""
    if stream.read(8) != b"!<arch>\n":
        raise ValueError("not an ar archive")
    members = {}
    while True:
        header = stream.read(60)
        if len(header) < 60:
            return members
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        members[name] = stream.read(size)
        if size % 2:
            stream.read(1)


def open_data_tar(deb):
    """A streaming tarfile of the package's files, and a function to finish it."""
    if shutil.which("dpkg-deb"):
        process = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)

        def finish():
            process.stdout.close()
            error = process.stderr.read().decode(errors="replace")
            if process.wait():
                sys.exit(f"error: dpkg-deb could not read {deb}: {error.strip()}")
        return tarfile.open(fileobj=process.stdout, mode="r|"), finish
    # No dpkg-deb: unpack the ar container (debian-binary, control.tar.*, data.tar.*).
    with open(deb, "rb") as stream:
        members = read_ar(stream)
    name = next((n for n in members if n.startswith("data.tar")), None)
    if name is None:
        sys.exit(f"error: {deb} has no data.tar member")
    data = members[name]
    if name.endswith(".zst"):
        if not shutil.which("zstd"):
            sys.exit(f"error: {deb} is zstd-compressed: install dpkg or zstd")
        data = subprocess.run(["zstd", "-dc"], input=data, stdout=subprocess.PIPE,
                              check=True).stdout
    return tarfile.open(fileobj=io.BytesIO(data), mode="r:*"), lambda: None


def deb_files(deb, wanted, links=None):
    """[(path, bytes)] of the regular files in a .deb whose path `wanted` accepts.

    Symbolic links that `wanted` accepts go into the dict `links` {path: target}.
    """
    tar, finish = open_data_tar(deb)
    files = []
    with tar:
        for member in tar:
            path = member.name.lstrip("./")
            if member.isfile() and wanted(path):
                files.append((path, tar.extractfile(member).read()))
            elif member.issym() and links is not None and wanted(path):
                links[path] = member.linkname
    finish()
    return files


def package_version(deb):
    """Version of a .deb from its file name (name_version_arch.deb)."""
    parts = deb.name.split("_")
    return urllib.parse.unquote(parts[1]) if len(parts) == 3 else "?"


# --------------------------------------------------------------------------
# Source readers: each takes {package: deb} and a `licences` dict to fill


def package_files(debs, licences, wanted):
    """{package: [(path, bytes)]} of wanted files; records copyright files."""
    files = {}
    for package, deb in debs.items():
        doc = f"usr/share/doc/{package}"
        copyright_path = doc + "/copyright"
        links = {}
        found = deb_files(deb, lambda path: path in (doc, copyright_path) or wanted(path), links)
        if doc in links:  # e.g. gimp-help-en -> gimp-help-common
            licences[package] = (f"/{doc} is a link to {links[doc]}: the copyright file is "
                                 f"in the package that owns /usr/share/doc/{links[doc]}.\n"
                                 ).encode()
        for path, data in found:
            if path == copyright_path:
                licences[package] = data
        files[package] = [(path, data) for path, data in found if path != copyright_path]
    return files


def read_ding(debs, licences):
    path = "usr/share/trans/de-en"
    found = [data for files in package_files(debs, licences, lambda p: p == path).values()
             for _, data in files]
    if not found:
        sys.exit(f"error: {' '.join(debs)} has no {path}")
    return list(ding_pairs(found[0].decode("utf-8").splitlines()))


def read_pages(debs, licences, prefix, languages):
    """{language: {page path: html}} of the .html files under `prefix`LANG/."""
    files = package_files(debs, licences,
                          lambda path: path.startswith(prefix) and path.endswith(".html"))
    pages = {lang: {} for lang in languages}
    for found in files.values():
        for path, data in found:
            lang, _, page = path[len(prefix):].partition("/")
            if lang in pages:
                pages[lang][page] = data.decode("utf-8", errors="replace")
    return pages


def read_lo_help(debs, licences):
    pages = read_pages(debs, licences, "usr/share/libreoffice/help/", ("en-US", "de"))
    return list(help_pairs(pages["en-US"], pages["de"]))


def read_gimp_help(debs, licences):
    pages = read_pages(debs, licences, "usr/share/gimp/2.0/help/", ("en", "de"))
    stats = collections.Counter()
    pairs = list(ordered_paragraph_pairs(pages["en"], pages["de"], stats))
    for key, value in stats.items():
        print(f"    {key}: {value} of {len(pages['en'])}")
    return pairs


# Calibre keeps its catalogues in a zip file: localization/locales.zip:de/messages.mo
CALIBRE_LOCALES = "/localization/locales.zip"


def german_catalogues(path, data):
    """[(name, .mo bytes)] of a German .mo file, or of the German .mo in a calibre zip."""
    if not path.endswith(CALIBRE_LOCALES):
        return [(path, data)]
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return [(f"{path}:{name}", archive.read(name)) for name in archive.namelist()
                if name == "de/messages.mo"]


def read_mo_catalogues(debs, licences):
    files = package_files(debs, licences, lambda path: (GERMAN_MO.search("/" + path)
                                                        or path.endswith(CALIBRE_LOCALES)))
    pairs = []
    for package in debs:
        count = len(pairs)
        for path, data in sorted(files[package]):
            for name, catalogue in german_catalogues(path, data):
                try:
                    pairs.extend((en, de, package) for en, de in mo_pairs(read_mo(catalogue)))
                except ValueError as error:
                    print(f"    warning: skipping {package}:{name}: {error}")
        print(f"    {package}: {len(pairs) - count} messages")
    return pairs


def all_sources(cache):
    """The corpus sources, in the order used for deduplication."""
    return [
        Source("ding", "Ding dictionary example sentences", ["trans-de-en"], read_ding),
        Source("lo-help", "LibreOffice help pages",
               ["libreoffice-help-en-us", "libreoffice-help-de"], read_lo_help),
        Source("wesnoth", "Battle for Wesnoth catalogues (data and campaigns)",
               lambda: wesnoth_packages(cache), read_mo_catalogues),
        Source("gimp-help", "GIMP user manual pages", ["gimp-help-en", "gimp-help-de"],
               read_gimp_help),
        Source("games", "catalogues of other games", ["freeciv-data", "widelands-data"],
               read_mo_catalogues),
        Source("apps", "catalogues of desktop applications",
               ["libreoffice-l10n-de", "gimp-data", "inkscape", "gnucash-common", "calibre",
                "blender-data", "digikam-data", "gramps", "evolution-common", "darktable",
                "gnumeric-common", "lyx-common"], read_mo_catalogues),
        Source("tech", "catalogues of developer and system tools",
               lambda: [newest(r"postgresql-(\d+)", cache), "git",
                        newest(r"gcc-(\d+)-locales", cache), "coreutils"],
               read_mo_catalogues),
    ]


# --------------------------------------------------------------------------
# Command line


def parse_args(argv=None, source_names=()):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="See the module docstring for the sources, cleaning and outputs.")
    parser.add_argument("--out", required=True, type=Path,
                        help="output directory (text files, bpe.codes and bin/)")
    parser.add_argument("--cache", type=Path,
                        help="folder for the downloaded .deb files, reused when present "
                             "(default: OUT/debs)")
    parser.add_argument("--sources", default=",".join(source_names),
                        help="comma-separated sources to use (default: %(default)s)")
    parser.add_argument("--valid-size", type=int, default=1500,
                        help="validation pairs (default: %(default)s)")
    parser.add_argument("--test-size", type=int, default=2000,
                        help="test pairs (default: %(default)s)")
    parser.add_argument("--max-pairs", type=int,
                        help="keep at most this many pairs in total (after shuffling)")
    parser.add_argument("--seed", type=int, default=1,
                        help="seed of the shuffle before splitting (default: %(default)s)")
    parser.add_argument("--bpe-ops", type=int, default=10000,
                        help="number of joint BPE merge operations (default: %(default)s)")
    parser.add_argument("--no-binarize", action="store_true",
                        help="stop after writing the BPE text files")
    parser.add_argument("--workers", type=int, default=1,
                        help="processes for tokenization and fairseq-preprocess "
                             "(default: %(default)s)")
    parser.add_argument("--examples", type=int, default=3,
                        help="sample pairs to print per source (default: %(default)s)")
    args = parser.parse_args(argv)
    args.sources = [s.strip() for s in args.sources.split(",") if s.strip()]
    unknown = sorted(set(args.sources) - set(source_names))
    if unknown or not args.sources:
        parser.error(f"unknown or no --sources {','.join(unknown)}; "
                     f"choose from {','.join(source_names)}")
    if args.cache is None:
        args.cache = args.out / "debs"
    return args


# --------------------------------------------------------------------------
# Text files, tokenization, BPE, binarization


def tokenize_splits(splits, workers):
    return prep_common.map_splits(lambda lines, lang: prep_common.tokenize(
        lines, lang, workers=workers, escape=False), splits, LANGS)


def binarize(out, workers):
    """Run fairseq-preprocess on ``out/{split}.{en,de}`` into ``out/bin``."""
    print("Running fairseq-preprocess")
    prep_common.binarize(out, "en", "de", workers)


def publish(staging, out):
    """Move the finished files from `staging` into `out`, replacing older ones."""
    for item in sorted(staging.iterdir()):
        target = out / item.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        item.rename(target)


# --------------------------------------------------------------------------


def collect(sources, cache):
    """Download the sources' packages and read {source: [(en, de)]}, licences, packages."""
    packages = {s.name: (s.packages() if callable(s.packages) else s.packages)
                for s in sources}
    debs = download([p for names in packages.values() for p in names], cache)
    raw, licences = collections.OrderedDict(), {}
    for source in sources:
        started = time.time()
        print(f"  {source.name} ({source.description}), {len(packages[source.name])} package(s)")
        raw[source.name] = source.reader({p: debs[p] for p in packages[source.name]}, licences)
        print(f"    -> {len(raw[source.name])} candidate pairs ({time.time() - started:.0f}s)")
    used = [(source, p, debs[p]) for source, names in packages.items() for p in names]
    return raw, licences, used


def print_report(stats, splits, examples):
    by_package = collections.defaultdict(collections.Counter)
    for pairs in splits.values():
        for _, _, origin in pairs:
            source, _, package = origin.partition("/")
            if package and source != "wesnoth":
                by_package[source][package] += 1
    print("Per source (after the filters and deduplication, in this order):")
    for source, counter in stats.items():
        drops = ", ".join(f"{k[len('dropped: '):]} {v}" for k, v in sorted(counter.items())
                          if k.startswith("dropped: "))
        print(f"  {source:9s} extracted {counter['extracted']:7d}  kept {counter['kept']:7d}"
              f"  (dropped: {drops or 'none'})")
        if by_package[source]:
            print("            kept per package: " + ", ".join(
                f"{package} {n}" for package, n in by_package[source].most_common()))
    print("Per split:")
    for split in SPLITS:
        pairs = splits[split]
        by_source = collections.Counter(origin.split("/")[0] for _, _, origin in pairs)
        words = sum(len(en.split()) for en, _, _ in pairs)
        print(f"  {split:5s} {len(pairs):7d} pairs, {words / max(len(pairs), 1):.1f} English "
              f"words/pair; " + ", ".join(f"{s} {n}" for s, n in sorted(by_source.items())))
    if examples:
        print("Sample valid pairs:")
        for source in stats:
            for en, de, _ in [p for p in splits["valid"]
                              if p[2].split("/")[0] == source][:examples]:
                print(f"  [{source}] en: {en}\n  {' ' * (len(source) + 2)} de: {de}")


def main(argv=None):
    started = time.time()
    # Let `kill` unwind normally, so that the temporary build folder is removed.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    source_names = [s.name for s in all_sources(None)]
    args = parse_args(argv, source_names)
    sources = [s for s in all_sources(args.cache) if s.name in args.sources]
    for module, hint in (("sacremoses", "pip install sacremoses"),
                         ("subword_nmt", "pip install subword-nmt")):
        require(module, hint)
    if not args.no_binarize:
        require("fairseq_cli.preprocess", "install fairseq, or use --no-binarize")

    print(f"Reading {len(sources)} sources")
    raw, licences, used = collect(sources, args.cache)
    pairs, stats = clean_corpus(raw)
    try:
        splits = split_corpus(pairs, args.valid_size, args.test_size, args.seed, args.max_pairs)
    except ValueError as error:
        sys.exit(f"error: {error}")
    print_report(stats, splits, args.examples)

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.out, prefix=".build-") as scratch:
        staging = Path(scratch)
        prep_common.write_splits(staging, splits, LANGS, "raw")
        for split, split_pairs in splits.items():
            write_lines(staging / f"{split}.origin", [source for _, _, source in split_pairs])
        write_lines(staging / "packages.tsv", ["source\tpackage\tversion\tdeb"] + [
            f"{source}\t{package}\t{package_version(deb)}\t{deb.name}"
            for source, package, deb in used])
        (staging / "licences").mkdir()
        for package, data in sorted(licences.items()):
            (staging / "licences" / f"{package}.copyright").write_bytes(data)

        step = time.time()
        tokenized = tokenize_splits(splits, args.workers)
        prep_common.write_splits(staging, tokenized, LANGS, "tok")
        print(f"Tokenized ({time.time() - step:.0f}s); learning {args.bpe_ops} joint BPE "
              "operations")
        step = time.time()
        segmented = prep_common.learn_and_apply_bpe(tokenized, LANGS, staging / "bpe.codes", args.bpe_ops)
        prep_common.write_splits(staging, segmented, LANGS)
        print(f"BPE done ({time.time() - step:.0f}s)")
        if not args.no_binarize:
            step = time.time()
            binarize(staging, args.workers)
            print(f"Binarized ({time.time() - step:.0f}s)")
        publish(staging, args.out)
    stale = args.out / "bin"
    if args.no_binarize and stale.is_dir():  # from an earlier run: no longer matches the text
        shutil.rmtree(stale)
        print(f"Removed the outdated {stale}")
    print(f"Done in {time.time() - started:.0f}s; output in {args.out}")


if __name__ == "__main__":
    main()
