"""The suite's scenarios (``bench/run.py``), one module each: ``run(suite)`` measures, prints its tables and
adds its rows to ``suite.summary``."""
