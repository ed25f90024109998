"""Checks of numeric arguments, with the messages Keras' own layers give.

Python and numpy numbers are accepted alike (``np.float32(0.1)`` is a rate,
``np.int64(4)`` a size); ``bool`` is never a number here, and a float is never
silently truncated to an integer (``k=2.5`` is refused, not read as 2).
"""

import numbers


def check_int(name, value, minimum=None, maximum=None):
    """Returns ``value`` as a Python int, or raises a ValueError naming it.

    Args:
        name: the argument's name in the message.
        value: the value received.
        minimum: smallest allowed value, or None.
        maximum: largest allowed value, or None.

    Returns:
        ``int(value)``.

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
    """Returns ``value`` as a Python float, or raises a ValueError naming it.

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

    Returns:
        ``float(value)``. NaN is refused, and so are infinities unless
        ``allow_infinite``.

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
        interval = f"{'(' if open_minimum else '['}{low}, {high}{')' if open_maximum else ']'}"
        raise ValueError(f"Expected {name} in {interval}. Received: {name}={value!r}.")
    return value
