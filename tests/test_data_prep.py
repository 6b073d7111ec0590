"""Data preparation: fairseq_aggressive/data_prep/common.py and the scripts of
scripts/data/: prepare_wmt.py, prepare_bea19.py and the from-text path of
prepare_uagec.py (tiny synthetic inputs, no network)."""

import importlib.util
import io
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest

from fairseq_aggressive.data_prep import common as prep_common
from helpers import python

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts" / "data"


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(name, *args):
    proc = python([sys.executable, str(SCRIPTS / f"{name}.py"), *map(str, args)],
                  cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def decode_bin(bin_dir, split, src, tgt, lang):
    """The lines of a binarized split, decoded with fairseq's Dictionary."""
    from fairseq.data import Dictionary, data_utils

    dictionary = Dictionary.load(str(bin_dir / f"dict.{lang}.txt"))
    dataset = data_utils.load_indexed_dataset(str(bin_dir / f"{split}.{src}-{tgt}.{lang}"),
                                              dictionary)
    return [dictionary.string(dataset[i]) for i in range(len(dataset))]


def lines(path):
    return prep_common.read_lines(path)


EN = ["The cat sat on the mat.", "Don't open the door, please!", "It costs 3.50 dollars.",
      "We saw a well-known actor in London.", "Where is the station?",
      "The weather is nice today.", "I like green tea and black coffee."]
DE = ["Die Katze saß auf der Matte.", "Öffne bitte nicht die Tür!", "Es kostet 3,50 Dollar.",
      "Wir sahen einen bekannten Schauspieler in London.", "Wo ist der Bahnhof?",
      "Das Wetter ist heute schön.", "Ich mag grünen Tee und schwarzen Kaffee."]


# --------------------------------------------------------------------------
# fairseq_aggressive.data_prep.common


@pytest.mark.slow  # the whole chain: tokenizer worker processes, BPE learning, fairseq-preprocess
def test_tokenize_bpe_binarize_round_trip(tmp_path):
    tok_en = prep_common.tokenize(EN, "en")
    tok_de = prep_common.tokenize(DE, "de")
    assert tok_en[1] == "Don 't open the door , please !"
    assert prep_common.tokenize(EN, "en", workers=2) == tok_en  # worker processes agree
    assert prep_common.tokenize(["a well-known actor"], "en", aggressive_dash_splits=True) == [
        "a well @-@ known actor"]
    assert prep_common.tokenize(["A & B"], "en", escape=True) == ["A &amp; B"]
    assert prep_common.detokenize(tok_en, "en") == EN
    assert prep_common.detokenize(tok_de, "de") == DE

    codes = tmp_path / "bpe.codes"
    prep_common.learn_bpe(tok_en + tok_de, codes, 30)
    assert len(lines(codes)) > 1
    bpe = {"en": prep_common.apply_bpe(codes, tok_en), "de": prep_common.apply_bpe(codes, tok_de)}
    assert any("@@ " in line for line in bpe["en"] + bpe["de"])  # some words were split
    assert prep_common.apply_bpe(codes, tok_en, workers=2) == bpe["en"]
    assert [prep_common.remove_bpe(line) for line in bpe["en"]] == tok_en
    # learning from files gives the same codes as from lines
    for lang, tok in (("en", tok_en), ("de", tok_de)):
        prep_common.write_lines(tmp_path / f"tok.{lang}", tok)
    prep_common.learn_bpe([tmp_path / "tok.en", tmp_path / "tok.de"], tmp_path / "codes2", 30)
    assert lines(tmp_path / "codes2") == lines(codes)

    for split in prep_common.SPLITS:
        for lang in ("en", "de"):
            prep_common.write_lines(tmp_path / f"{split}.{lang}", bpe[lang])
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "dict.en.txt").write_text("stale 1\n")  # removed, not an error
    prep_common.binarize(tmp_path, "en", "de", workers=1)
    bin_dir = tmp_path / "bin"
    assert (bin_dir / "dict.en.txt").read_bytes() == (bin_dir / "dict.de.txt").read_bytes()
    for split in prep_common.SPLITS:
        assert decode_bin(bin_dir, split, "en", "de", "en") == bpe["en"]
        assert decode_bin(bin_dir, split, "en", "de", "de") == bpe["de"]


@pytest.mark.slow  # (a process of its own that imports torch and fairseq)
def test_binarize_reports_failure(tmp_path):
    with pytest.raises(SystemExit, match="missing input files"):
        prep_common.binarize(tmp_path, "en", "de", workers=1)
    for split in prep_common.SPLITS:
        for lang in ("en", "de"):
            prep_common.write_lines(tmp_path / f"{split}.{lang}", ["a b"])
    with pytest.raises(SystemExit, match="fairseq-preprocess failed"):
        prep_common.binarize(tmp_path, "en", "de", workers=0)  # invalid worker count


def test_read_lines_splits_on_newline_only(tmp_path):
    path = tmp_path / "x"
    path.write_bytes("a\u2028b\r\nc\x1cd\n\ne".encode())
    assert prep_common.read_lines(path) == ["a\u2028b", "c\x1cd", "", "e"]


def test_normalize_wmt():
    assert prep_common.normalize_wmt("„Hallo“ –  Welt\u200b!", "de") == '"Hallo" - Welt !'
    ro = "Aşa ţară, şi Ştefan"
    assert prep_common.normalize_wmt(ro, "ro") == "Așa țară, și Ștefan"
    assert prep_common.normalize_wmt(ro, "ro", remove_diacritics=True) == "Asa tara, si Stefan"
    assert prep_common.normalize_wmt("Aşa", "en") == "Aşa"


# --------------------------------------------------------------------------
# prepare_wmt.py


def sgm(lines_, lang, kind):
    body = "".join(f'<seg id="{i}"> {line} </seg>\n' for i, line in enumerate(lines_, 1))
    return (f'<{kind}set setid="newstest2014" srclang="any" trglang="{lang}">\n'
            f'<doc sysid="{kind}" docid="d1" origlang="en">\n<p>\n{body}</p>\n</doc>\n'
            f'</{kind}set>\n')


def make_wmt14_raw(raw):
    """Tiny files laid out like the extracted WMT14 archives (the test set as .tgz)."""
    corpora = {"training/europarl-v7.de-en": (EN[:4] * 3, DE[:4] * 3),
               "commoncrawl.de-en": (EN[4:] * 3, DE[4:] * 3),
               "training/news-commentary-v9.de-en": (
                   EN + ["Short.", " ".join(["word"] * 260)],
                   DE + ["Das ist ein sehr viel längerer Satz als das Original hier.",
                         " ".join(["Wort"] * 260)])}
    for prefix, (en, de) in corpora.items():
        (raw / prefix).parent.mkdir(parents=True, exist_ok=True)
        prep_common.write_lines(raw / f"{prefix}.en", en)
        prep_common.write_lines(raw / f"{prefix}.de", de)
    (raw / "dev").mkdir()
    prep_common.write_lines(raw / "dev" / "newstest2013.en", EN[:3])
    prep_common.write_lines(raw / "dev" / "newstest2013.de", DE[:3])
    test_en = ["The cat & the dog.", "Where is   the station?"]
    test_de = ["Die Katze & der Hund.", "Wo ist der Bahnhof?"]
    with tarfile.open(raw / "test-full.tgz", "w:gz") as tar:
        for name, text in (("test-full/newstest2014-deen-src.en.sgm", sgm(test_en, "en", "src")),
                           ("test-full/newstest2014-deen-ref.de.sgm", sgm(test_de, "de", "ref"))):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return test_en, test_de


def test_read_sgm(tmp_path):
    path = tmp_path / "t.sgm"
    path.write_text(sgm(["A &amp; b  c", "<b>d</b>"], "en", "src"))
    assert load_script("prepare_wmt").read_sgm(path) == ["A &amp; b c", "<b>d</b>"]


def test_keep_pair_like_clean_corpus():
    wmt = load_script("prepare_wmt")
    assert wmt.keep_pair("a b", "c d e")
    assert not wmt.keep_pair("a b", "c d e f")  # ratio 2 > 1.5
    assert not wmt.keep_pair("", "a")
    assert not wmt.keep_pair(" ".join("a" * 251), " ".join("b" * 251))
    assert wmt.keep_pair(" ".join("a" * 250), " ".join("b" * 250))


@pytest.mark.slow
def test_prepare_wmt_end_to_end(tmp_path):
    raw, out = tmp_path / "raw", tmp_path / "out"
    raw.mkdir()
    test_en, test_de = make_wmt14_raw(raw)
    run_script("prepare_wmt", "--pair", "wmt14-en-de", "--raw-dir", raw, "--out", out,
               "--bpe-ops", "1000", "--workers", "1")
    n_train = 12 + 9 + 7  # the overlong and the ratio-violating pairs are dropped
    for lang in ("en", "de"):
        assert len(lines(out / f"train.{lang}")) == n_train
        assert len(lines(out / f"valid.{lang}")) == 3
        assert len(lines(out / f"test.{lang}")) == 2
        assert [prep_common.remove_bpe(x) for x in lines(out / f"train.{lang}")] == \
            lines(out / f"train.tok.{lang}")
    assert "Short ." not in lines(out / "train.tok.en")
    assert lines(out / "train.tok.en")[:2] == ["The cat sat on the mat .",
                                               "Don 't open the door , please !"]
    assert lines(out / "test.detok.de") == test_de
    assert lines(out / "test.raw.en") == ["The cat & the dog.", "Where is the station?"]
    assert lines(out / "test.tok.de") == ["Die Katze & der Hund .", "Wo ist der Bahnhof ?"]
    assert (out / "bpe.codes").is_file() and not (out / ".tmp").exists()
    bin_dir = out / "bin"
    assert (bin_dir / "dict.en.txt").read_bytes() == (bin_dir / "dict.de.txt").read_bytes()
    test = decode_bin(bin_dir, "test", "en", "de", "de")  # "&" and "Hu" are unseen: <unk>
    assert len(test) == 2 and test[1] == lines(out / "test.de")[1] == "Wo ist der Bahnhof ?"
    assert decode_bin(bin_dir, "valid", "en", "de", "de") == lines(out / "valid.de")
    assert decode_bin(bin_dir, "train", "en", "de", "en") == lines(out / "train.en")

    # --max-train-pairs: the first N pairs, over the corpora in order
    small = tmp_path / "small"
    proc = run_script("prepare_wmt", "--pair", "wmt14-en-de", "--raw-dir", raw, "--out", small,
                      "--bpe-ops", "1000", "--workers", "2", "--max-train-pairs", "12",
                      "--no-binarize")
    assert "commoncrawl: 0 pairs" in proc.stdout
    assert lines(small / "train.tok.en") == lines(out / "train.tok.en")[:12]
    assert not (small / "bin").exists()


def test_prepare_wmt_missing_raw_files(tmp_path):
    proc = python([sys.executable, str(SCRIPTS / "prepare_wmt.py"), "--pair",
                   "wmt16-en-ro", "--raw-dir", str(tmp_path), "--out",
                   str(tmp_path / "out")], capture_output=True,
                  text=True)
    assert proc.returncode != 0
    assert "europarl-v8.ro-en.en" in proc.stderr and "training-parallel-ep-v8.tgz" in proc.stderr


# --------------------------------------------------------------------------
# prepare_bea19.py

TRAIN_M2 = """\
S This are a sentence .
A 1 2|||R:VERB:SVA|||is|||REQUIRED|||-NONE-|||0
A 1 2|||R:VERB:SVA|||was|||REQUIRED|||-NONE-|||1

S I like very the music .
A 2 3|||U:ADV|||-NONE-|||REQUIRED|||-NONE-|||0
A 5 5|||M:ADV|||very much|||REQUIRED|||-NONE-|||0
A 0 1|||R:PRON|||We|||REQUIRED|||-NONE-|||1

S Nothing wrong here .
A -1 -1|||noop|||-NONE-|||REQUIRED|||-NONE-|||0

S He go to school yesterday
A 1 2|||R:VERB:TENSE|||went|||REQUIRED|||-NONE-|||0
A 5 5|||M:PUNCT|||.|||REQUIRED|||-NONE-|||0
A 0 0|||M:ADV|||Then ,|||REQUIRED|||-NONE-|||0

S Only the second annotator edits .
A 0 1|||R:ADV|||Just|||REQUIRED|||-NONE-|||1

"""

EXPECTED = [("This are a sentence .", "This is a sentence ."),
            ("I like very the music .", "I like the music very much ."),
            ("Nothing wrong here .", "Nothing wrong here ."),
            ("He go to school yesterday", "Then , He went to school yesterday ."),
            ("Only the second annotator edits .", "Only the second annotator edits .")]


def test_m2_pairs_apply_annotator_0(tmp_path):
    bea = load_script("prepare_bea19")
    path = tmp_path / "train.m2"
    path.write_text(TRAIN_M2)
    assert bea.m2_pairs(path) == EXPECTED
    assert bea.m2_pairs(path, annotator=1)[1] == ("I like very the music .",
                                                   "We like very the music .")


@pytest.mark.slow
def test_prepare_bea19_end_to_end(tmp_path):
    train, conll14 = tmp_path / "train.m2", tmp_path / "conll14.m2"
    train.write_text(TRAIN_M2 * 3)
    conll14.write_text(TRAIN_M2)
    out = tmp_path / "out"
    proc = run_script("prepare_bea19", "--nucle", train, "--fce", train, train,
                      "--conll14", conll14, "--out", out, "--bpe-ops", "30")
    assert "valid: missing" in proc.stdout
    assert lines(out / "train.tok.src") == [s for s, _ in EXPECTED] * 9
    assert lines(out / "train.tok.tgt") == [t for _, t in EXPECTED] * 9
    assert lines(out / "test.tok.src") == [s for s, _ in EXPECTED]
    assert (out / "gold" / "conll14.m2").read_text() == TRAIN_M2
    assert not (out / "valid.tok.src").exists()
    assert "valid\tmissing" in lines(out / "splits.txt")
    assert decode_bin(out / "bin", "test", "src", "tgt", "tgt") == lines(out / "test.tgt")
    assert [prep_common.remove_bpe(x) for x in lines(out / "train.src")] == \
        lines(out / "train.tok.src")

    dropped = tmp_path / "dropped"
    run_script("prepare_bea19", "--lang8", train, "--conll13", conll14, "--wi-dev", conll14,
               "--out", dropped, "--bpe-ops", "30", "--drop-unchanged", "--no-binarize")
    assert len(lines(dropped / "train.tok.src")) == 3 * 3
    assert lines(dropped / "valid.tok.src") == lines(dropped / "wi_dev.tok.src")
    assert sorted(p.name for p in (dropped / "gold").iterdir()) == ["conll13.m2", "wi_dev.m2"]


# --------------------------------------------------------------------------
# prepare_uagec.py --from-text


@pytest.mark.slow
def test_prepare_uagec_from_text(tmp_path):
    sample, out = tmp_path / "sample", tmp_path / "out"
    sample.mkdir()
    for split, n in (("train", 40), ("valid", 5), ("test", 5)):
        for side in ("src", "tgt"):
            src = prep_common.read_lines(ROOT / "data" / "uagec-sample" / f"{split}.tok.{side}")
            prep_common.write_lines(sample / f"{split}.tok.{side}", src[:n])
    run_script("prepare_uagec", "--from-text", sample, "--out", out, "--bpe-ops", "100")
    for split in prep_common.SPLITS:
        for side in ("src", "tgt"):
            assert lines(out / f"{split}.tok.{side}") == lines(sample / f"{split}.tok.{side}")
            assert [prep_common.remove_bpe(x) for x in lines(out / f"{split}.{side}")] == \
                lines(sample / f"{split}.tok.{side}")
    assert decode_bin(out / "bin", "train", "src", "tgt", "src") == lines(out / "train.src")


def test_m2_pairs_alternatives_and_bad_spans(tmp_path):
    """prepare_bea19 reads M2 with the scorer's reader: the first of ``a||b``
    alternatives is applied; an edit outside its sentence is a clear error."""
    bea = load_script("prepare_bea19")
    path = tmp_path / "alt.m2"
    path.write_text("S He go home\nA 1 2|||R:VERB|||goes||went|||REQUIRED|||-NONE-|||0\n\n")
    assert bea.m2_pairs(path) == [("He go home", "He goes home")]
    path.write_text("S He go home\nA 1 7|||R:VERB|||goes|||REQUIRED|||-NONE-|||0\n\n")
    with pytest.raises(SystemExit, match="outside the sentence"):
        bea.m2_pairs(path)


HELD = threading.Lock()


def _can_take_the_held_lock(_):
    """In a worker: whether a lock that another thread of the caller holds can be taken here
    (a forked worker has a copy that stays locked; a worker started afresh has its own)."""
    took = HELD.acquire(timeout=2)
    if took:
        HELD.release()
    return took


@pytest.mark.slow  # (a process of its own that imports torch and fairseq)
def test_worker_processes_do_not_inherit_locks_held_by_other_threads():
    """prep_common's worker processes start from a process without threads, not as a fork of
    the caller: a lock another thread holds while the workers start is free in them (a fork
    would copy it locked, and a worker needing it would wait forever)."""
    release = threading.Event()
    holder = threading.Thread(target=lambda: (HELD.acquire(), release.wait(30), HELD.release()))
    holder.start()
    try:
        while not HELD.locked():
            time.sleep(0.01)
        assert list(prep_common._map(_can_take_the_held_lock, range(4), workers=2, chunksize=1)) == [True] * 4
    finally:
        release.set()
        holder.join()
