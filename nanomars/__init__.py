"""nanoMARS: the smallest complete implementation of MARS (Mask AutoRegression)."""
