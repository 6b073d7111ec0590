"""The sources of the English-German corpus: for each, the packages it reads
and a reader that turns their files into (English, German) pairs."""
import collections
import io
import sys
import zipfile

from .debian_packages import Source, deb_files, newest, wesnoth_packages
from .debian_text import GERMAN_MO, ding_pairs, help_pairs, mo_pairs, ordered_paragraph_pairs, read_mo



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
