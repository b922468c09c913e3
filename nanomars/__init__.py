"""nanoMARS: the smallest complete implementation of MARS (Mask AutoRegression). This folder is the method,
read in this order: masks.py, model.py, dual_track.py, decode.py (one sequence), engine.py and
strategies.py (many at once), batch_decode.py (the calls). Beside it: compare/ (what MARS is compared
with), scale/ (real checkpoints, many GPUs), util/ (the commands' plumbing). The core imports none of them."""
