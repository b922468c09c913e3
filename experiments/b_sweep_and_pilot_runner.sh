#!/bin/sh
# The B sweep and the competent pilot in their protocols' order (docs/long_runs.md), one single-threaded
# process at a time.
# Every step skips the runs its results file already holds, so running this again resumes.
set -e
export OMP_NUM_THREADS=1
python experiments/b_sweep.py --seeds 1        # the B sweep: one seed of every condition first
python experiments/competent.py --pilot        # the competent pilot (5 AR-SFT runs)
python experiments/b_sweep.py                  # the B sweep: seeds 2 and 3
