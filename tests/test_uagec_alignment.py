"""UA-GEC sentence alignment (scripts/data/prepare_uagec.py) on hand-made documents:
sentence spans from the package's sentence files, closing quotes given back to
their sentence, edits assigned to sentences (merging those an edit crosses),
target sentences rendered from the edits, the whole-document check."""
from types import SimpleNamespace

import pytest

from test_data_prep import load_script

ua = load_script("prepare_uagec")


def edit(start, end, text, suggestion):
    return SimpleNamespace(start=start, end=end, source_text=text, suggestions=[suggestion])


def document(text, sentences, edits):
    """A stand-in for ua_gec's Document: original text, sentence file, edits."""
    target, pos = [], 0
    for e in sorted(edits, key=lambda e: (e.start, e.end)):
        assert text[e.start:e.end] == e.source_text
        target += [text[pos:e.start], e.suggestions[0]]
        pos = e.end
    target.append(text[pos:])
    annotated = SimpleNamespace(get_original_text=lambda: text, get_annotations=lambda: list(edits))
    return SimpleNamespace(annotated=annotated, source_sentences=sentences, source=text, target="".join(target))


def test_sentence_spans_ignore_spacing_and_check_the_text():
    text = "Привіт,  світе.\nЯк справи?"
    assert ua.sentence_spans(text, ["Привіт, світе.", "Як справи?"]) == [(0, 15), (16, 26)]
    with pytest.raises(ValueError, match="does not match"):
        ua.sentence_spans(text, ["Привіт, світе."])


def test_closing_quotes_go_back_to_their_sentence():
    text = 'Він сказав "Йди." Потім пішов.'
    spans = ua.sentence_spans(text, ['Він сказав "Йди.', '" Потім пішов.'])
    assert [text[a:b] for a, b in ua.reattach_closing_quotes(text, spans)] == ['Він сказав "Йди."', "Потім пішов."]
    # a straight quote that opens a quotation stays where it is
    text = 'Раз. "Два," три.'
    spans = ua.sentence_spans(text, ["Раз.", '"Два," три.'])
    assert ua.reattach_closing_quotes(text, spans) == spans


def test_edits_render_targets_and_merge_crossed_boundaries():
    text = "Я йду додому. Він теж йде. Все добре."
    edits = [edit(2, 5, "йду", "іду"),             # inside sentence 1
             edit(12, 16, ". Ві", ", ві"),         # crosses the boundary between 1 and 2: merged
             edit(37, 37, "", " Так.")]            # an insertion after the last sentence joins it
    doc = document(text, ["Я йду додому.", "Він теж йде.", "Все добре."], edits)
    pairs, merged = ua.align_document(doc)
    assert merged == 1
    assert pairs == [("Я йду додому. Він теж йде.", "Я іду додому, він теж йде."),
                     ("Все добре.", "Все добре. Так.")]
    assert ua.covers_document(doc, pairs)


def test_whitespace_edit_between_sentences_is_dropped_and_check_catches_shifted_edits():
    text = "Один.  Два."
    doc = document(text, ["Один.", "Два."], [edit(5, 7, "  ", " ")])
    pairs, merged = ua.align_document(doc)
    assert pairs == [("Один.", "Один."), ("Два.", "Два.")] and merged == 0
    assert ua.covers_document(doc, pairs)
    # an edit whose offsets do not fit the text (as a literal "\n" in an .ann file causes)
    bad = document(text, ["Один.", "Два."], [])
    bad.target = "Один. Три."
    assert not ua.covers_document(bad, ua.align_document(bad)[0])
