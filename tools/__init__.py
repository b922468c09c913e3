"""Commands a user runs after training, read by users of those commands: evaluate.py (held-out accuracy),
bench.py (the side-by-side speed table) and gpu_check.py (the prepared GPU script). Run each as
python tools/<name>.py; tests import them as tools.<name>."""
