"""The benchmark harness: `python -m specjax bench`."""
