"""Code shared by the data preparation scripts (scripts/data/): tokenization,
BPE and binarization (``common``), and the Debian English-German corpus
(``debian_packages``, ``debian_sources``, ``debian_text``)."""
