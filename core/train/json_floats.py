"""JSON numbers parsed a whole column at a time with numpy, exactly as Python's float() reads them.

numpy's own string-to-float cast takes ~300 ns a value and holds the GIL, so the Monitor's reading of a million-step
metrics.jsonl (four float columns) spent over a second in it while the window waited for the GIL. `json_floats`
does the same work in ~25 whole-array numpy operations (which release the GIL): the digits are combined eight at a
time in 64-bit words, the value is formed in double-double arithmetic (~104 bits) and rounded once; where that
rounding cannot be told apart from the true one (the double-double value within 2**-80 of a point halfway between
two floats, about one value in 10**8) or the text is no JSON number this reads, it says so and the caller parses
that value the slow way.
"""

from __future__ import annotations

import sys
from fractions import Fraction

import numpy as np

# The widest value text read (the column readers' fixed field): a float's repr is at most 24 characters.
WIDTH = 24
# Decimal exponents the double-double powers of ten cover; a value beyond them is parsed the slow way. Every
# product stays far inside the normal floats (Dekker's split needs ~2**996 of headroom, and its error terms must not
# be subnormal).
EXP_MIN, EXP_MAX = -280, 280
# A double-double result nearer than this (relative) to a halfway point is parsed the slow way: the result is
# within ~2**-100 of the true value, so 2**-80 leaves a margin of a million.
TIE_MARGIN = 2.0**-80
_SPLIT = 134217729.0  # 2**27 + 1: Dekker's split of a double into two 26-bit halves
_DOT, _MINUS, _PLUS, _E, _ZERO = 46, 45, 43, 101, 48
_LITTLE = sys.byteorder == "little"


def _powers() -> tuple[np.ndarray, np.ndarray]:
    """10**k for k in [EXP_MIN, EXP_MAX] as double-double (high, low): high the nearest float, low the nearest
    float to what high leaves out."""
    high, low = [], []
    for k in range(EXP_MIN, EXP_MAX + 1):
        exact = Fraction(10) ** k
        h = float(exact)
        high.append(h)
        low.append(float(exact - Fraction(h)))
    return np.array(high), np.array(low)


_P_HIGH, _P_LOW = _powers()
# Row k: 0xFF in the bytes of columns below k, as WIDTH // 8 words (the first column in each word's lowest byte).
_BYTES_BELOW = (np.arange(WIDTH)[None, :] < np.arange(WIDTH + 1)[:, None]).astype(np.uint8) * np.uint8(255)
_BYTES_BELOW = _BYTES_BELOW.view(np.uint64) if sys.byteorder == "little" else _BYTES_BELOW.view(np.uint64).byteswap()


def _two_product(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """a*b as p + err exactly (Dekker), for a, b far from overflow and underflow."""
    p = a * b
    t = _SPLIT * a
    a_hi = t - (t - a)
    a_lo = a - a_hi
    t = _SPLIT * b
    b_hi = t - (t - b)
    b_lo = b - b_hi
    err = ((a_hi * b_hi - p) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo
    return p, err


def _two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """a+b as s + err exactly (Knuth)."""
    s = a + b
    v = s - a
    return s, (a - (s - v)) + (b - v)


def _eight_digits(words: np.ndarray) -> np.ndarray:
    """Each uint64 of eight digit values (0-9, the most significant in the lowest byte) as the number they write."""
    words = (words * np.uint64(10 * 256 + 1)) >> np.uint64(8)
    words = ((words & np.uint64(0x00FF00FF00FF00FF)) * np.uint64(100 * 65536 + 1)) >> np.uint64(16)
    return ((words & np.uint64(0x0000FFFF0000FFFF)) * np.uint64(10000 * 2**32 + 1)) >> np.uint64(32)


def json_floats(text: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The JSON numbers in `text` as float64, each exactly what float() makes of it.

    Args:
        text: (n, WIDTH) uint8, C-contiguous: each row a value's text, NUL after its `length` bytes.
        length: (n,) int64, each 1 to WIDTH.

    Returns:
        values (n,) float64, and ok (n,) bool: False where the text is no JSON number
        (`-?(0|[1-9]d*)(.d+)?([eE][+-]?d+)?`), or one this does not read exactly (an exponent of more than three
        digits or past EXP_MIN/EXP_MAX, a value too near a halfway point); those values are undefined.
    """
    # Whole-array operations only: a row is 24 bytes, and numpy's per-row costs (broadcasts, reductions along a
    # row, np.where over rows) are ten times those of the flat operations on bytes and 64-bit words used here.
    n = len(text)
    rows = np.arange(n)
    neg = text[:, 0] == _MINUS
    digits = text - np.uint8(_ZERO)
    is_digit = digits < 10
    digits *= is_digit  # every other byte (sign, dot, e, NUL) reads as a 0 digit
    counts = np.bitwise_count(is_digit.view(np.uint64))
    others = length - (counts[:, 0].astype(np.int64) + counts[:, 1] + counts[:, 2])
    dot = text == _DOT
    p = dot.argmax(axis=1)
    has_dot = dot[rows, p]
    e = (text | np.uint8(32)) == _E
    q = e.argmax(axis=1)
    has_e = e[rows, q]
    q = np.where(has_e, q, length)
    after_e = text[rows, np.minimum(q + 1, WIDTH - 1)]
    signed = has_e & ((after_e == _MINUS) | (after_e == _PLUS))
    # Every byte inside is a digit but for the sign, one dot, one e and the exponent's sign, each where it belongs.
    ok = others == neg.astype(np.int64) + has_dot + has_e + signed
    first = neg.astype(np.int64)
    int_end = np.where(has_dot, p, q)
    ok &= int_end > first  # a digit before the dot or e
    ok &= ~has_dot | (q > p + 1)  # a digit after the dot, before the e
    exp_digits = length - q - 1 - signed
    ok &= ~has_e | ((exp_digits >= 1) & (exp_digits <= 3))  # longer exponents overflow, or go the slow way
    ok &= ~((text[rows, first] == _ZERO) & (int_end > first + 1))  # no leading zero
    exponent = np.zeros(n, dtype=np.int64)
    for k in range(3):
        more = has_e & (k < exp_digits)
        at = np.minimum(q + 1 + signed + k, WIDTH - 1)
        exponent = np.where(more, exponent * 10 + digits[rows, at], exponent)
    exponent = np.where(after_e == _MINUS, -exponent, exponent)
    # The mantissa's digits, the dot taken out (the integer part moves one to the right) and the exponent's zeroed:
    # the row then reads as a 24-digit integer X, and the value is X * 10**(exponent - fraction digits - (WIDTH - q)).
    words = digits.view(np.uint64)  # (n, 3); the lowest byte of a word is its first character
    if not _LITTLE:
        words = words.byteswap()
    moved = np.empty_like(words)  # each row one byte to the right
    moved[:, 0] = words[:, 0] << np.uint64(8)
    moved[:, 1:] = (words[:, 1:] << np.uint64(8)) | (words[:, :-1] >> np.uint64(56))
    before_dot = _BYTES_BELOW[np.where(has_dot, p + 1, 0)]  # (n, 3) masks of the bytes up to the dot
    words = ((moved & before_dot) | (words & ~before_dot)) & _BYTES_BELOW[q]
    limbs = _eight_digits(words).astype(np.float64)  # (n, 3), each below 10**8
    scale = exponent - np.where(has_dot, q - p - 1, 0) - (WIDTH - q)
    ok &= (scale >= EXP_MIN) & (scale <= EXP_MAX)
    index = np.clip(scale - EXP_MIN, 0, len(_P_HIGH) - 1)
    # X in double-double: limb0 * 1e16 + limb1 * 1e8 + limb2 (the last two terms exact).
    high, err = _two_product(limbs[:, 0], np.full(n, 1e16))
    high, err1 = _two_sum(high, limbs[:, 1] * 1e8)
    high, err2 = _two_sum(high, limbs[:, 2])
    low = err + err1 + err2
    value, err = _two_product(high, _P_HIGH[index])
    err += high * _P_LOW[index] + low * _P_HIGH[index]
    rounded = value + err
    left = err - (rounded - value)  # what rounding to one float left out (Fast2Sum)
    zero = high == 0
    ok &= zero | ((rounded > 1e-250) & (rounded < 1e250))
    # The halfway points next to `rounded`: half its spacing away, above and below (less below a power of two).
    bits = rounded.view(np.int64)
    up = (bits + 1).view(np.float64) - rounded
    down = rounded - (bits - 1).view(np.float64)
    half = np.where(left >= 0, up, down) * 0.5
    ok &= zero | (half - np.abs(left) > TIE_MARGIN * rounded)
    rounded[zero] = 0.0
    return np.where(neg, -rounded, rounded), ok


def masked_to(text: np.ndarray, length: np.ndarray) -> None:
    """Zero each row of `text` ((n, WIDTH) uint8, C-contiguous) after its first `length` bytes ((n,), 0 to WIDTH),
    in place."""
    words = text.view(np.uint64)
    words &= _BYTES_BELOW[length]
