#!/bin/sh
# Issue 29's runs in their protocols' order (docs/issue29_runs.md), one single-threaded process at a time.
# Every step skips the runs its results file already holds, so running this again resumes.
set -e
export OMP_NUM_THREADS=1
python experiments/b_sweep.py --seeds 1        # item 3: one seed of every condition first
python experiments/competent.py --pilot        # item 4: the pilot (5 AR-SFT runs)
python experiments/b_sweep.py                  # item 3: seeds 2 and 3
