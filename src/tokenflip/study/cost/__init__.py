"""What a study will cost before it runs: the fitted cost model (`model`), its calibration
on this machine (`calibrate`) and the estimate per cell and in all (`estimate`)."""
