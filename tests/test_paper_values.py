"""Every config value marked ``[paper]`` against configs/paper-values.yaml, the
values transcribed from the papers with the table each comes from: each marked
line has an entry, each entry sits on a marked line, and each entry's value is
the config's (a value changed on one side only fails)."""
import glob
import os

import pytest
import yaml

from helpers import ROOT

CONFIGS = os.path.join(ROOT, "configs")
MARK = "[paper]"


def _entries():
    with open(os.path.join(CONFIGS, "paper-values.yaml"), encoding="utf-8") as f:
        return yaml.safe_load(f)


def _lines_of_keys(node, path=(), out=None, seen=None):
    """Each mapping key's path -> the line (0-based) it is written on, not through merges or
    aliases (an alias is the node of its anchor, met first in the document)."""
    out = {} if out is None else out
    seen = set() if seen is None else seen
    if isinstance(node, yaml.MappingNode) and id(node) not in seen:
        seen.add(id(node))
        for k, v in node.value:
            if k.value == "<<":
                continue
            p = path + (k.value,)
            out[p] = k.start_mark.line
            _lines_of_keys(v, p, out, seen)
    return out


def _at(config, key):
    value = config
    for part in key.split("."):
        assert isinstance(value, dict) and part in value, f"{key}: no {part!r} here"
        value = value[part]
    return value


def _marked_configs():
    return sorted(p for p in glob.glob(os.path.join(CONFIGS, "**", "*.yaml"), recursive=True)
                  if os.path.basename(p) != "paper-values.yaml")


@pytest.mark.parametrize("path", _marked_configs(), ids=lambda p: os.path.relpath(p, CONFIGS))
def test_marked_values_are_the_papers(path):
    data = _entries()
    name = os.path.relpath(path, CONFIGS)
    entries = [e for e in data["values"] if e["config"] == name]
    with open(path, encoding="utf-8") as f:
        text = f.read()
    config = yaml.safe_load(text)
    keys = _lines_of_keys(yaml.compose(text))
    lines = text.splitlines()
    marked = {i for i, ln in enumerate(lines) if MARK in ln and not ln.lstrip().startswith("#")}
    covered = set()
    for e in entries:
        assert e["paper"] in data["papers"] and e.get("source"), e
        key = tuple(e["key"].split("."))
        assert key in keys, f"{name}: {e['key']} is not in the config"
        line = keys[key]
        under = {keys[k] for k in keys if k[:len(key)] == key}  # its line and those of the keys under it
        above = {keys[key[:i]] for i in range(1, len(key))}  # a mark on a mapping covers what it holds
        assert (under | above) & marked, f"{name}:{line + 1}: {e['key']} is not marked {MARK}"
        covered |= (under | above) & marked
        have = _at(config, e["key"])
        if isinstance(e["value"], dict):
            for k, v in e["value"].items():
                assert isinstance(have, dict) and have.get(k) == v, \
                    f"{name}: {e['key']}.{k} is {have.get(k) if isinstance(have, dict) else have!r}; " \
                    f"{e['source']} gives {v!r}"
        else:
            assert have == e["value"], f"{name}: {e['key']} is {have!r}; {e['paper']} {e['source']} gives {e['value']!r}"
    for i in sorted(marked - covered):
        raise AssertionError(f"{name}:{i + 1}: marked {MARK} but configs/paper-values.yaml has no entry for it: "
                             f"{lines[i].strip()}")


def test_a_changed_value_fails(tmp_path, monkeypatch):
    """The check catches a config value that differs from the paper's."""
    src = os.path.join(CONFIGS, "translation", "wmt14_ende.yaml")
    with open(src, encoding="utf-8") as f:
        text = f.read()
    wrong = text.replace("gad-beta: 5, gad-tau: 3.0}   # high efficiency [paper]",
                         "gad-beta: 5, gad-tau: 6.0}   # high efficiency [paper]")
    assert wrong != text
    root = tmp_path / "configs"
    (root / "translation").mkdir(parents=True)
    (root / "translation" / "wmt14_ende.yaml").write_text(wrong, encoding="utf-8")
    with open(os.path.join(CONFIGS, "paper-values.yaml"), encoding="utf-8") as f:
        (root / "paper-values.yaml").write_text(f.read(), encoding="utf-8")
    import sys

    monkeypatch.setattr(sys.modules[__name__], "CONFIGS", str(root))
    with pytest.raises(AssertionError, match="gad-tau is 6.0"):
        test_marked_values_are_the_papers(str(root / "translation" / "wmt14_ende.yaml"))
    unmarked = text.replace("      lr: 0.001                       # [paper]\n", "      lr: 0.001\n")
    assert unmarked != text
    (root / "translation" / "wmt14_ende.yaml").write_text(unmarked, encoding="utf-8")
    with pytest.raises(AssertionError, match="is not marked"):
        test_marked_values_are_the_papers(str(root / "translation" / "wmt14_ende.yaml"))
