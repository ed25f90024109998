"""``python -m keras_masking.demo``: the same as ``keras-masking demo``."""

import sys

from keras_masking.demo.pipeline import main

if __name__ == "__main__":
    sys.exit(main())
