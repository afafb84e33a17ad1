"""The driver (``run_repair.sh`` and ``expansion/05_06_rounds.py``): the settings, checked before any work, and the
steps that run the stages' scripts in order, skip what is done and resume what was interrupted.

- :mod:`.settings_table` -- every setting with its default, type, range and help: the one table;
- :mod:`.settings` -- profiles, validation, cross rules and the settings record of a run;
- :mod:`.steps` -- one step with the shell's contract (done marker, ``.cmd``, log, the files it wrote);
- :mod:`.expansion_rounds` -- Stage II's rounds (05 -> 06 until ``TARGET_K`` verified or ``MAX_ROUNDS``).

The top layer: it may import any stage; nothing imports it.
"""
