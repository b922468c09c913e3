"""What MARS is compared with, read after the core (nanomars/*.py) by whoever weighs MARS against its
peers and the paper's baselines: prompt lookup and a draft model (speculative.py), Medusa heads
(medusa.py), tree verification (tree.py) and stacking (stack.py), the block-level caches and the
released block sampler (block_cache.py), block diffusion (block_diffusion.py) and the window-alignment
diagnostic (diagnose.py). Each plugs into the core through its interfaces; the core imports none of it.
Importing this package registers the comparisons' training objectives with train.py
(dual_track.OBJECTIVES and STARTS): block diffusion's and the Medusa heads'."""
from . import block_diffusion, medusa  # noqa: F401  (imported for their registrations)
