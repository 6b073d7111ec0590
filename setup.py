from setuptools import find_packages, setup

setup(
    name="fairseq-aggressive",
    version="0.1.0",
    description="Aggressive (draft -> verify -> accept) decoding for fairseq: "
    "greedy-identical output, several times faster",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    packages=find_packages(include=["fairseq_aggressive", "fairseq_aggressive.*"]),
    # the native engine's C++ sources, compiled at first use
    package_data={"fairseq_aggressive.native": ["csrc/*"]},
    python_requires=">=3.8",
    install_requires=[
        # fairseq 0.12.2 does not import on Python >= 3.11; fairseq-fixed ships the
        # same `fairseq` module for 3.11+
        "fairseq==0.12.2; python_version < '3.11'",
        "fairseq-fixed==0.12.3.1; python_version >= '3.11'",
        "numpy<2",
        "pyyaml",  # configs/ (scripts/experiments/pipeline.py); fairseq pulls it in too
        "sacrebleu>=2.0",
        "sacremoses",
        "subword-nmt",
        "tqdm",
    ],
    extras_require={
        "data": ["ua-gec"],
        "bench": ["matplotlib"],
        "test": ["pytest"],
        # CTranslate2 as a benchmark baseline (bench modes ct2, ct2-int8)
        "ct2": ["ctranslate2>=4.0"],
        # ERRANT (BEA-19 evaluation); pulls in spaCy. The English model must be
        # installed separately: python -m spacy download en_core_web_sm
        "gec": ["errant"],
    },
    entry_points={
        "console_scripts": [
            "fairseq-aggressive-bench = fairseq_aggressive.bench:cli_main",
            "fairseq-aggressive-m2 = fairseq_aggressive.evaluation.m2:main",
            "fairseq-aggressive-gleu = fairseq_aggressive.evaluation.gleu:main",
            "fairseq-aggressive-bleu = fairseq_aggressive.evaluation.bleu:main",
        ]
    },
)
