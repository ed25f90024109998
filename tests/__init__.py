"""The keras_masking test suite; its folders mirror the package."""
