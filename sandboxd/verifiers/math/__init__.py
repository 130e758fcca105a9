"""Math answer verifier: extract a final answer from a completion and compare it to a ground truth.

This package runs inside the sandbox agent's forked, unprivileged worker. Parsing untrusted LaTeX
with sympy is code execution in all but name and can hang, so the agent enforces a hard deadline
from *outside* by killing the worker. Consequently nothing here installs a timeout of its own:
Math-Verify's ``parse``/``verify`` timeouts are ``signal.alarm`` based, which only works in the
main thread and would fight the agent's own supervision, so they are always disabled
(``parsing_timeout=None`` / ``timeout_seconds=None``). What this module does do is refuse work
that is cheap to recognise as pathological (huge or deeply nested inputs, towers of powers)
before sympy gets to evaluate it.

Pipeline: :func:`verify` extracts the final answer (``\\boxed{}`` / ``<answer>`` / "the answer
is" / last math expression), normalises a few notations that Math-Verify misreads, parses both
sides with ``math_verify.parse`` and compares them with Math-Verify's grader, in which the
numeric comparison has been replaced by an exact/relative-tolerance one (see below).

Modules, each importing only those listed before it:

- ``notation``: delimiters, text macros, units, scale words and "or" words that both of the next two read;
- ``extraction``: the final answer of a completion (:func:`extract_answer`);
- ``normalisation``: the extracted strings rewritten for Math-Verify, and the cheap structure checks;
- ``mathverify``: Math-Verify's grader and parser as private, patched copies, and the bounds on sympy;
- ``judge``: :func:`verify`, its ordered rules (``judge.RULES``) and :func:`warm`.

Deliberate differences from Math-Verify (0.9.0), each fixing a wrong verdict:

===============================  ==========================  =================================
Input (gold vs answer)           Math-Verify                 Here
===============================  ==========================  =================================
``1/2004!`` vs ``1/2006!``       equal (#14: ``evalf``       different: exact rationals are
                                 with ``chop`` rounds tiny   compared exactly
                                 values to 0)
``1/2^99`` vs ``1/2^98``         equal (#14, same cause)     different
``0.0000001`` vs ``0.0000002``   equal (``round(6)`` is an   different: relative tolerance
                                 absolute tolerance)         ``float_tolerance`` (1e-6)
``1234567.891`` vs               different (absolute         equal (relative 4e-10)
``1234567.8915``                 ``round(6)``)
``1000000`` vs ``1000001.0``     different                   different: against an integer the
                                                             tolerance is absolute
``0.0000005`` vs ``0``           equal (``round(6)``)        different: never looser than the
                                                             relative tolerance
``10^{20}+1`` vs                 equal (``simplify`` of the  different: no symbolic fallback
``1.0 \\times 10^{20}``           difference at 53 bits)      for an integer the float rounds
``4`` vs ``4\\sqrt(2)``           equal (#41: ``\\sqrt(2)``    ``\\sqrt(...)`` rewritten to
                                 normalised to ``4\\\\sqrt``)  ``\\sqrt{...}``; different
``3*x-1*y+13=0`` vs              equal (#60: plain text      whole extracted answer parsed as
``3x + 4y + 14=0``               extraction takes the ``0``) LaTeX first; different lines
``1/3`` vs ``\\int_0^1 x^2 dx``  equal (evaluated)           different: an integral, sum,
                                                             product, limit, derivative,
                                                             max/min or gcd/lcm the ground
                                                             truth lacks is the question
                                                             restated, not its answer
``Paris`` vs ``sirap``           equal (letters parsed as a  text answers compared as
                                 commutative product)        normalised text
``B`` vs ``(B)`` / ``B) 42``     parsed as symbols           choice letters compared
                                                             (case-insensitive)
``1.5e3`` vs ``1500``            ``1.5*E*3``                 scientific notation understood
``3 1/2`` vs ``7/2``             ``3*1/2``                   mixed number
``3,5`` vs ``3.5``               set ``{3, 5}``              decimal comma when the gold is a
                                                             single number
``15`` vs ``x^2+15 \\oops{``      equal (its plain-text       different: the plain-text
                                 extractor picks a number    extractor only reads answers made
                                 out of unparsable LaTeX)    of digits and operators
``x^2+8x+16`` vs completion      no answer (``2x+3``: ``2``) the whole undelimited expression
``(x+4)^2`` (no ``$``/box)                                   (not the last number)
``2/3`` vs ``0.\\overline{6}``    different (read as ``0``)   repeating decimal, exact
``\\sqrt{-1}`` vs ``i``,          different (``i`` is a       equal: ``i`` as the only letter
``\\frac{2}{1-i}`` vs ``1+i``     symbol)                     is the imaginary unit
``3`` vs ``1+2\\mathrm{i}``       equal (text dropped)        different: ``\\mathrm{i}`` is ``i``
``\\frac12`` vs                   different (degree dropped)  equal: degrees in trig arguments
``\\sin 30^\\circ``
``x=3, y=4`` vs ``(4, 3)``       equal (values as a set)     different: a pair takes the
                                                             unknowns in the order named
``e^2`` vs ``\\mathrm{e}^2``     different (upright e read   equal: an upright e is Euler's
                                 as a symbol)                number, as an upright i is the unit
``5`` vs ``5\\%``                 equal (``50% = 50 = 0.5``:  different: X% is X/100 unless the
                                 one answer, two readings)   gold is written as a percentage
``2`` vs ``2+``, ``2^+``, ``2'``  equal (the mark dropped)    different: a mark the parser drops
``3`` vs a fullwidth 3           different (unparsable)      equal: decimal digits of any script
``2`` vs ``2 oder 3``            equal (its first number)    different: "or" in other languages
``0`` vs                         different (``simplify``     equal: 0 at 1000 and 4000 bits,
``\\cos\\frac{\\pi}{7}+             cannot prove it)            shrinking (_vanishes)
\\cos\\frac{3\\pi}{7}+
\\cos\\frac{5\\pi}{7}-\\frac12``
===============================  ==========================  =================================
"""

from __future__ import annotations

from .extraction import EXTRACTION_MODES, extract_answer
from .judge import MAX_ANSWER_CHARS, verify, warm
from .mathverify import MAX_FIELD_CHARS

__all__ = ["EXTRACTION_MODES", "MAX_ANSWER_CHARS", "MAX_FIELD_CHARS", "extract_answer", "verify", "warm"]
