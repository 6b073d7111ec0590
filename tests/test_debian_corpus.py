"""The Debian en-de corpus builder (scripts/data/prepare_debian_ende.py and its
modules fairseq_aggressive/data_prep/debian_text.py, debian_packages.py): text
processing and .deb reading on hand-made inputs (no network, no downloaded .deb
files)."""

import importlib.util
import io
import shutil
import struct
import tarfile
from pathlib import Path

import pytest

from fairseq_aggressive.data_prep import debian_packages as debs
from fairseq_aggressive.data_prep import debian_text as dtext

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "data" / "prepare_debian_ende.py"
spec = importlib.util.spec_from_file_location("prepare_debian_ende", SCRIPT)
pde = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pde)


def make_mo(entries):
    """Bytes of a little-endian .mo catalogue with `entries` [(msgid, msgstr)]."""
    entries = sorted(entries)
    ids = [k.encode() for k, _ in entries]
    strs = [v.encode() for _, v in entries]
    header_size = 28
    ids_at = header_size
    strs_at = ids_at + 8 * len(entries)
    data_at = strs_at + 8 * len(entries)
    blob, id_table, str_table = b"", b"", b""
    for table, items in (("ids", ids), ("strs", strs)):
        for item in items:
            entry = struct.pack("<2I", len(item), data_at + len(blob))
            blob += item + b"\0"
            if table == "ids":
                id_table += entry
            else:
                str_table += entry
    header = struct.pack("<7I", 0x950412DE, 0, len(entries), ids_at, strs_at, 0, 0)
    return header + id_table + str_table + blob


# --------------------------------------------------------------------------
# Ding


def test_ding_pairs_takes_corresponding_example_sentences():
    lines = [
        "# Version :: devel",
        "Stille {f}; Ruhe {f} | um Ruhe bitten | Darf ich um Ruhe bitten? | "
        "Es trat eine tiefe Stille ein. :: silence; quiet | to request silence | "
        "Can I have some quiet, please? | There fell a deep silence.",
        # the parts do not correspond: skipped
        "Aal {m} | Aale {pl} | Der Aal ist glatt. :: eel | Eels are slippery.",
        # placeholders and a/b alternatives are not sentences
        "jdn. fordern | Er wird gefordert, wenn jdn. etwas stört. :: to challenge sb. | "
        "He is challenged when sth. bothers sb.",
        "Sparen | Durch Ausgaben wird eingespart/Geld gespart. :: saving | "
        "Joint spending will save money.",
        "Lass es doch sein! [ugs.] :: Forget it now!; Skip it!",
    ]
    assert list(dtext.ding_pairs(lines)) == [
        ("Can I have some quiet, please?", "Darf ich um Ruhe bitten?"),
        ("There fell a deep silence.", "Es trat eine tiefe Stille ein."),
        ("Forget it now!", "Lass es doch sein!"),
    ]


def test_clean_ding_removes_annotations_inside_alternatives():
    assert dtext.clean_ding("to ken {kenned, kent; kenned} sb. [Sc.]; to know") == "to ken sb."


# --------------------------------------------------------------------------
# Help pages


def test_help_pairs_align_by_id_and_strip_markup():
    english = {"text/a.html": (
        '<h1 id="hd_id1">Title</h1>'
        '<p id="par_id2" class="paragraph">Click <a href="x">here</a> to save the '
        '<span class="literal">file</span>, then &quot;OK&quot;.</p>'
        '<p id="bm_id3">bookmark</p>'
        '<p id="par_id4">Only in English.</p>'
        '<p id="par_id5">Twice, first.</p><p id="par_id5">Twice, second.</p>')}
    german = {"text/a.html": (
        '<h1 id="hd_id1">Titel</h1>'
        '<p id="par_id2">Klicken Sie <a href="x">hier</a>, um die '
        '<span>Datei</span> zu speichern, dann &quot;OK&quot;.</p>'
        '<p id="bm_id3">Lesezeichen</p>'
        '<p id="par_id5">Zweimal, erstens.</p><p id="par_id5">Zweimal, zweitens.</p>'),
        "text/b.html": '<p id="par_id1">Nur Deutsch.</p>'}
    assert sorted(dtext.help_pairs(english, german)) == sorted([
        ("Title", "Titel"),
        ('Click here to save the file, then "OK".',
         'Klicken Sie hier, um die Datei zu speichern, dann "OK".'),
        ("Twice, first.", "Zweimal, erstens."),
        ("Twice, second.", "Zweimal, zweitens."),
    ])


def test_ordered_paragraph_pairs_skip_pages_with_other_structure():
    english = {"a.html": "<p>One.</p><div><p class='x'>Two<br/>lines.</p></div>",
               "b.html": "<p>Extra.</p><p>Para.</p>"}
    german = {"a.html": "<p>Eins.</p><div><p>Zwei<br>Zeilen.</p></div>",
              "b.html": "<p>Absatz.</p>"}
    stats = {"pages skipped (paragraph counts differ)": 0}
    assert list(dtext.ordered_paragraph_pairs(english, german, stats)) == [
        ("One.", "Eins."), ("Two lines.", "Zwei Zeilen.")]
    assert stats["pages skipped (paragraph counts differ)"] == 1


# --------------------------------------------------------------------------
# gettext catalogues


def test_read_mo_round_trip():
    entries = [("", "Content-Type: text/plain; charset=UTF-8\n"),
               ("Hello world", "Hallo Welt"),
               ("ctx\x04Open file", "Datei öffnen"),
               ("One unit\x00%d units", "Eine Einheit\x00%d Einheiten")]
    assert sorted(dtext.read_mo(make_mo(entries))) == sorted(entries)


def test_read_mo_rejects_other_files():
    with pytest.raises(ValueError):
        dtext.read_mo(b"\0" * 40)


@pytest.mark.parametrize("text, expected", [
    ("<b>Bold</b> and <span color='red'>red</span> text", "Bold and red text"),
    ("<italic>text='Strong'</italic> units do more damage.", "Strong units do more damage."),
    ("female^I will lead them.", "I will lead them."),
    ("?nation:The Greeks are here.", "The Greeks are here."),
    ("Save the _file as ~template", "Save the file as template"),
    ("Dokument~vorlage, Ver&lust, Ö_ffnen", "Dokumentvorlage, Verlust, Öffnen"),
    ("Copy && paste &Everything", "Copy & paste Everything"),
    ("Saves the %PRODUCTNAME document.", "Saves the LibreOffice document."),
    ("Reduces corruption by 50% in a city.", "Reduces corruption by 50% in a city."),
    ("Error while loading %s:", None),
    ("%qD is too small", None),
    ("value after x=%.*s", None),
    ("The player $name left.", None),
    ("Value of type '$2'.", None),
    ("Wrong size {:d}, must be {} digits", None),
    ("Listen on port <port> now", None),
    ("%(count)s files", None),
])
def test_clean_message(text, expected):
    assert dtext.clean_message(text) == expected


def test_mo_pairs_contexts_plurals_and_paragraphs():
    entries = [
        ("", "Project-Id-Version: x\n"),
        ("Untranslated message here", ""),
        ("menu\x04Open the selected file now", "Die ausgewählte Datei jetzt öffnen"),
        ("One unit was lost in battle\x00Many units were lost", "Eine Einheit ging verloren\x00Viele"),
        ("First paragraph.\n\nSecond paragraph.", "Erster Absatz.\n\nZweiter Absatz."),
        ("One paragraph\nwrapped.", "Ein Absatz.\n\nZwei Absätze."),
        ("Loading %s failed", "Laden von %s fehlgeschlagen"),
    ]
    assert list(dtext.mo_pairs(entries)) == [
        ("Open the selected file now", "Die ausgewählte Datei jetzt öffnen"),
        ("One unit was lost in battle", "Eine Einheit ging verloren"),
        ("First paragraph.", "Erster Absatz."),
        ("Second paragraph.", "Zweiter Absatz."),
        ("One paragraph wrapped.", "Ein Absatz. Zwei Absätze."),
    ]


# --------------------------------------------------------------------------
# Filtering, deduplication, splitting


@pytest.mark.parametrize("en, de, reason", [
    ("This is a good sentence.", "Das ist ein guter Satz.", None),
    ("Too short here.", "Zu kurz hier jetzt.", "too short"),
    (" ".join(["word"] * 61), " ".join(["Wort"] * 61), "too long"),
    ("One two three four.", "Eins zwei drei vier fünf sechs sieben acht neun.", "length ratio"),
    ("Figure 16.154. Saturation Options here", "Abbildung 16.154. Saturation Options here",
     "untranslated"),
    ("Send crash reports to The Document Foundation", "Absturzberichte an The Document "
     "Foundation senden", None),
])
def test_filter_reason(en, de, reason):
    assert dtext.filter_reason(en, de) == reason


def test_clean_corpus_deduplicates_sources_and_targets_in_source_order():
    raw = {"first": [("The cat sat on the mat.", "Die Katze saß auf der Matte."),
                     ("Short one.", "Kurz.")],
           "second": [("the cat sat on the mat", "Eine Katze saß auf einer Matte.", "pkg"),
                      ("A dog sat on the mat.", "Die Katze saß auf der Matte!", "pkg"),
                      ("A bird  sat on the ’tree’s’ top.", "Ein Vogel saß oben auf dem Baum.",
                       "pkg")]}
    pairs, stats = dtext.clean_corpus(raw)
    assert pairs == [("The cat sat on the mat.", "Die Katze saß auf der Matte.", "first"),
                     ("A bird sat on the ’tree's’ top.", "Ein Vogel saß oben auf dem Baum.",
                      "second/pkg")]
    assert stats["first"] == {"extracted": 2, "kept": 1, "dropped: too short": 1}
    assert stats["second"] == {"extracted": 3, "kept": 1, "dropped: duplicate": 2}


def test_split_corpus_is_deterministic_and_disjoint():
    pairs = [(f"English sentence number {i}.", f"Deutscher Satz Nummer {i}.", "s")
             for i in range(100)]
    splits = dtext.split_corpus(pairs, valid_size=10, test_size=15, seed=3)
    assert {k: len(v) for k, v in splits.items()} == {"test": 15, "valid": 10, "train": 75}
    assert splits == dtext.split_corpus(pairs, valid_size=10, test_size=15, seed=3)
    assert splits != dtext.split_corpus(pairs, valid_size=10, test_size=15, seed=4)
    sources = [{en for en, _, _ in v} for v in splits.values()]
    assert len(set.union(*sources)) == 100
    capped = dtext.split_corpus(pairs, valid_size=10, test_size=15, seed=3, max_pairs=40)
    assert len(capped["train"]) == 15
    with pytest.raises(ValueError):
        dtext.split_corpus(pairs[:20], valid_size=10, test_size=15, seed=3)


# --------------------------------------------------------------------------
# .deb reading without dpkg-deb


def test_read_ar_and_data_tar_fallback(tmp_path, monkeypatch):
    payload = io.BytesIO()
    with tarfile.open(fileobj=payload, mode="w:gz") as tar:
        for name, data in (("./usr/share/doc/pkg/copyright", b"GPL"),
                           ("./usr/share/locale/de/LC_MESSAGES/pkg.mo", b"mo")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    members = [("debian-binary", b"2.0\n"), ("control.tar.gz", b"x"),
               ("data.tar.gz", payload.getvalue())]
    deb = b"!<arch>\n"
    for name, data in members:
        deb += f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode()
        deb += data + (b"\n" if len(data) % 2 else b"")
    path = tmp_path / "pkg_1.0_all.deb"
    path.write_bytes(deb)

    assert debs.read_ar(io.BytesIO(deb))["debian-binary"] == b"2.0\n"
    monkeypatch.setattr(debs.shutil, "which", lambda name: None)  # no dpkg-deb
    found = debs.deb_files(path, lambda p: dtext.GERMAN_MO.search("/" + p))
    assert found == [("usr/share/locale/de/LC_MESSAGES/pkg.mo", b"mo")]
    assert debs.package_version(path) == "1.0"


def _sentences(n, seed):
    import random

    rng = random.Random(seed)
    en = "the a house garden window opens closes quickly slowly today river bank bridge".split()
    de = "das ein Haus Garten Fenster öffnet schließt schnell langsam heute Fluss Ufer Brücke".split()
    out = []
    for i in range(n):
        idx = [rng.randrange(len(en)) for _ in range(rng.randint(5, 9))]
        out.append((" ".join(en[j] for j in idx).capitalize() + f" {i}.",
                    " ".join(de[j] for j in idx).capitalize() + f" {i}."))
    return out


@pytest.mark.slow  # (the preparation script end to end)
def test_from_model_segments_and_binarizes_with_the_models_codes_and_dictionary(tmp_path, monkeypatch):
    """--from-model DIR: the corpus is segmented with DIR's bpe.codes and binarized with its joined
    dictionary (what a model built on another build of the corpus reads), not with codes and a
    dictionary learned on this one; a model without them, or with two different dictionaries, is
    refused before anything is read."""
    monkeypatch.setattr(pde, "collect", lambda sources, cache: (
        {"ding": _sentences(400, 1)}, {}, []))
    first = tmp_path / "first"
    pde.main(["--out", str(first), "--valid-size", "20", "--test-size", "20", "--bpe-ops", "40",
              "--sources", "ding", "--examples", "0"])
    model = tmp_path / "model"
    model.mkdir()
    shutil.copyfile(first / "bpe.codes", model / "bpe.codes")
    for lang in ("en", "de"):
        shutil.copyfile(first / "bin" / "dict.en.txt", model / f"dict.{lang}.txt")
    # another build of the corpus: other sentences, which alone would learn other codes
    monkeypatch.setattr(pde, "collect", lambda sources, cache: (
        {"ding": _sentences(300, 2)}, {}, []))
    alone, reused = tmp_path / "alone", tmp_path / "reused"
    common = ["--valid-size", "20", "--test-size", "20", "--bpe-ops", "60", "--sources", "ding", "--examples", "0"]
    pde.main(["--out", str(alone)] + common)
    pde.main(["--out", str(reused), "--from-model", str(model)] + common)
    assert (alone / "bpe.codes").read_text() != (model / "bpe.codes").read_text()
    assert (reused / "bpe.codes").read_text() == (model / "bpe.codes").read_text()
    for lang in ("en", "de"):
        assert (reused / "bin" / f"dict.{lang}.txt").read_text() == (model / "dict.en.txt").read_text()
    assert (reused / "test.tok.en").read_text() == (alone / "test.tok.en").read_text()  # the same pairs
    assert (reused / "bin" / "test.en-de.en.bin").exists()
    (model / "dict.de.txt").write_text("x 1\n")
    with pytest.raises(SystemExit):
        pde.main(["--out", str(tmp_path / "bad"), "--from-model", str(model)] + common)
    (model / "bpe.codes").unlink()
    with pytest.raises(SystemExit):
        pde.main(["--out", str(tmp_path / "bad"), "--from-model", str(model)] + common)
    assert not (tmp_path / "bad").exists()
