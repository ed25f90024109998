"""Checks of numeric arguments, with the messages Keras' own layers give.

Python and numpy numbers are accepted alike (``np.float32(0.1)`` is a rate,
``np.int64(4)`` a size); ``bool`` is never a number here, and a float is never
silently truncated to an integer (``k=2.5`` is refused, not read as 2).
"""

import difflib
import inspect
import numbers
import os

#: The largest seed numpy's generators take (2**32 - 1).
MAX_SEED = 2**32 - 1


def check_int(name, value, minimum=None, maximum=None):
    """Returns ``value`` as a Python int, or raises a ValueError naming it.

    Args:
        name: the argument's name in the message.
        value: the value received.
        minimum: smallest allowed value, or None.
        maximum: largest allowed value, or None.

    Example:

    >>> import numpy as np
    >>> check_int("units", np.int64(4), minimum=1)
    4
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"Expected an integer for {name}. Received: {name}={value!r}.")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"Expected an integer >= {minimum} for {name}. Received: {name}={value}.")
    if maximum is not None and value > maximum:
        raise ValueError(f"Expected an integer <= {maximum} for {name}. Received: {name}={value}.")
    return value


def check_float(
    name,
    value,
    minimum=None,
    maximum=None,
    open_minimum=False,
    open_maximum=False,
    allow_infinite=False,
):
    """Returns ``value`` as a Python float (not NaN), or raises a ValueError naming it.

    Args:
        name: the argument's name in the message.
        value: the value received (an int or float, Python or numpy).
        minimum: smallest allowed value, or None.
        maximum: largest allowed value, or None.
        open_minimum: True if ``minimum`` itself is excluded.
        open_maximum: True if ``maximum`` itself is excluded.
        allow_infinite: True if ``inf`` / ``-inf`` are meaningful values
            here; by default they are refused like NaN, since no rate, scale
            or temperature trains with them.

    Example:

    >>> import numpy as np
    >>> check_float("rate", np.float32(0.25), 0.0, 1.0, open_maximum=True)
    0.25
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != value:
        raise ValueError(f"Expected a number for {name}. Received: {name}={value!r}.")
    value = float(value)
    if not allow_infinite and value in (float("inf"), float("-inf")):
        raise ValueError(f"Expected a finite number for {name}. Received: {name}={value!r}.")
    low_ok = minimum is None or (value > minimum if open_minimum else value >= minimum)
    high_ok = maximum is None or (value < maximum if open_maximum else value <= maximum)
    if not (low_ok and high_ok):
        low = "-inf" if minimum is None else minimum
        high = "inf" if maximum is None else maximum
        # An absent bound is inf, which the interval holds only when infinite values are allowed.
        opened = "(" if open_minimum or (minimum is None and not allow_infinite) else "["
        closed = ")" if open_maximum or (maximum is None and not allow_infinite) else "]"
        interval = f"{opened}{low}, {high}{closed}"
        raise ValueError(f"Expected {name} in {interval}. Received: {name}={value!r}.")
    return value


def check_bool(name, value):
    """Returns ``value`` as a Python bool, or raises a ValueError naming it.

    Args:
        name: the argument's name in the message.
        value: the value received (``True``/``False``, or a numpy bool).

    Example:

    >>> check_bool("verbose", False)
    False
    """
    if type(value).__name__ not in ("bool", "bool_"):
        raise ValueError(f"Expected True or False for {name}. Received: {name}={value!r}.")
    return bool(value)


def check_choice(name, value, choices):
    """Returns ``value`` if it is one of ``choices``, or raises a ValueError.

    Args:
        name: the argument's name in the message.
        value: the value received.
        choices: the allowed values (a tuple or list).

    Example:

    >>> check_choice("mode", "gather", ("gather", "attention"))
    'gather'
    """
    try:
        allowed = value in choices
    except TypeError:  # an unhashable value against a set
        allowed = False
    if not allowed:
        listed = ", ".join(repr(choice) for choice in choices)
        raise ValueError(f"Expected one of {listed} for {name}. Received: {name}={value!r}.")
    return value


def check_seed(name, value):
    """Returns ``value`` as an int >= 0, or None; raises a ValueError otherwise.

    Args:
        name: the argument's name in the message.
        value: None or an integer >= 0.

    Example:

    >>> check_seed("seed", None) is None
    True
    """
    if value is None:
        return None
    return check_int(name, value, minimum=0, maximum=MAX_SEED)


def check_str_list(name, value, allow_empty=True):
    """Returns ``value`` as a list of strings, or raises a ValueError.

    A list or tuple of strings is accepted; a string alone is not (iterating
    it would give its characters, each then a name of its own).

    Args:
        name: the argument's name in the message.
        value: the sequence received.
        allow_empty: False to refuse an empty sequence.

    Example:

    >>> check_str_list("var_names", ("bias", "gamma"))
    ['bias', 'gamma']
    """
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError(
            f"Expected a list of strings for {name} (a single name in a list: [{value!r}]). "
            f"Received: {name}={value!r}."
        )
    if not allow_empty and not value:
        raise ValueError(f"Expected a non-empty list of strings for {name}. Received: {name}=[].")
    return list(value)


def check_int_list(name, value, minimum=None, maximum=None, allow_empty=True, unique=False):
    """Returns ``value`` as a tuple of Python ints, or raises a ValueError.

    A list, tuple or 1-D numpy array of integers is accepted; a string, a
    float or a nested list is not.

    Args:
        name: the argument's name in the message.
        value: the sequence received.
        minimum: smallest allowed entry, or None.
        maximum: largest allowed entry, or None.
        allow_empty: False to refuse an empty sequence.
        unique: True to refuse repeated entries.

    Example:

    >>> check_int_list("unselectable_token_ids", [101, 102], minimum=0)
    (101, 102)
    """
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ValueError(f"Expected a list of integers for {name}. Received: {name}={value!r}.")
    entries = list(value)
    if not allow_empty and not entries:
        raise ValueError(f"Expected a non-empty list of integers for {name}. Received: {name}=[].")
    checked = []
    for entry in entries:
        if isinstance(entry, bool) or not isinstance(entry, numbers.Integral):
            raise ValueError(f"Expected a list of integers for {name}. Received: {name}={value!r}.")
        entry = int(entry)
        if (minimum is not None and entry < minimum) or (maximum is not None and entry > maximum):
            low = "(-inf" if minimum is None else f"[{minimum}"
            high = "inf)" if maximum is None else f"{maximum}]"
            raise ValueError(
                f"Expected every entry of {name} in {low}, {high}. Received: {name}={value!r}."
            )
        checked.append(entry)
    if unique and len(set(checked)) != len(checked):
        raise ValueError(f"Expected distinct entries in {name}. Received: {name}={value!r}.")
    return tuple(checked)


def check_path(name, value):
    """Returns ``value`` as a str path, or raises a TypeError naming it.

    Args:
        name: the argument's name in the message.
        value: a str or `os.PathLike` (a `pathlib.Path`).

    Example:

    >>> import pathlib
    >>> check_path("output_dir", pathlib.Path("out"))
    'out'
    """
    if isinstance(value, (str, os.PathLike)) and not isinstance(value, bytes):
        path = os.fspath(value)
        if isinstance(path, str):
            return path
    raise TypeError(f"Expected a path (str or os.PathLike) for {name}. Received: {name}={value!r}.")


# What a Keras functional model takes besides its own arguments.
MODEL_KEYWORDS = ("name", "trainable", "dtype")


def check_model_keywords(owner, keywords):
    """Refuses keyword arguments a functional model would drop without a word.

    Keras' functional models ignore unknown keywords: a misspelled setting
    (``droptoken=`` for ``drop_token=``, in code or in a preset's
    ``config.json``) would turn a method off silently.

    Args:
        owner: the model's class (its constructor's arguments are suggested).
        keywords: the ``**kwargs`` the constructor received.

    Example:

    >>> class Model:
    ...     def __init__(self, num_layers, **kwargs):
    ...         check_model_keywords(type(self), kwargs)
    >>> _ = Model(2, name="bert")
    >>> _ = Model(2, num_layer=2)
    Traceback (most recent call last):
    ...
    ValueError: Model got the unknown argument(s) ['num_layer'] (did you mean 'num_layers'?). Expected its own arguments or Keras' ['name', 'trainable', 'dtype'].
    """  # noqa: E501
    unknown = sorted(set(keywords) - set(MODEL_KEYWORDS))
    if not unknown:
        return
    arguments = inspect.signature(owner.__init__).parameters
    known = [name for name in arguments if name not in ("self", "kwargs")] + list(MODEL_KEYWORDS)
    squashed = {name.replace("_", "").lower(): name for name in known}  # droptoken: drop_token

    def closest(name):
        match = squashed.get(name.replace("_", "").lower())
        return [match] if match else difflib.get_close_matches(name, known, n=1)

    hints = [f"{close[0]!r}" for close in map(closest, unknown) if close]
    raise ValueError(
        f"{owner.__name__} got the unknown argument(s) {unknown}"
        + (f" (did you mean {', '.join(hints)}?)" if hints else "")
        + f". Expected its own arguments or Keras' {list(MODEL_KEYWORDS)}."
    )
