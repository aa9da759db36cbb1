"""``python -m workbench fuzz``: generated scheduling scenarios run through PD and the
standalone baseline, judged by an exact oracle, the differences no known finding explains
shrunk to a minimal case (docs/fuzz.md).

``space`` is what may vary, ``scenario`` one draw of it (Hypothesis strategies), ``trial``
runs one on a ``Session``'s servers, ``oracle`` compares, ``attribute`` asks the known
findings' detectors, ``hunt`` is the loop and ``records`` what it writes.
"""
